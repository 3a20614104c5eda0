"""Gangs from templates without a cluster: member indices, template members' steps, owners, failure semantics.

Slices come from the real driver code on the simulator (``tests/controllerkit``); pods and Jobs
are the dicts the API would return (``tests/templatekit``).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.controller import events, names
from gpuplane.controller.gang import desired, membership, owners, placement_record, release, world, writes
from gpuplane.controller.gang import spec as gangspec
from gpuplane.controller.gang.podview import view
from gpuplane.controller.node import snapshot_builder
from tests.controllerkit import GB200, claim_index, gang_body, pod_index
from tests.templatekit import (
    NS,
    cluster_slices_fixture,  # noqa: F401
    decide,
    decision_of,
    indexed,
    job,
    job_pod,
    running_gang,
    template_claim,
    world_of,
)


class TestIdentity:
    def test_named_claim_wins(self) -> None:
        pod = {"metadata": {"name": "p"}, "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "tp8-3"}]}}
        assert membership.identity("tp8", 4, view(pod)) == membership.Identity(3, membership.MODE_NAMED)

    def test_label_then_completion_index(self) -> None:
        pod = job_pod("g", "p", labels={names.LABEL_MEMBER_INDEX: "2", membership.COMPLETION_INDEX: "0"})
        assert membership.identity("g", 4, view(pod)) == membership.Identity(2, membership.MODE_TEMPLATE)
        pod = job_pod("g", "p", annotations={membership.COMPLETION_INDEX: "1"})
        assert membership.identity("g", 4, view(pod)).index == 1

    def test_jobset_global_index_times_pods_per_job(self) -> None:
        labels = {
            membership.JOBSET_GLOBAL_INDEX: "1",
            membership.JOBSET_GLOBAL_REPLICAS: "2",
            membership.COMPLETION_INDEX: "1",
        }
        assert membership.identity("g", 4, view(job_pod("g", "p", labels=labels))).index == 3  # 1 x 2 + 1

    @pytest.mark.parametrize(
        ("labels", "count", "says"),
        [
            ({membership.JOBSET_GLOBAL_INDEX: "0", membership.JOBSET_GLOBAL_REPLICAS: "3"}, 4, "do not split evenly"),
            (
                {
                    membership.JOBSET_GLOBAL_INDEX: "0",
                    membership.JOBSET_GLOBAL_REPLICAS: "2",
                    membership.COMPLETION_INDEX: "2",
                },
                4,
                "2 member(s) per Job",
            ),
            ({names.LABEL_MEMBER_INDEX: "x"}, 2, "is not an index"),
            ({}, 2, "says no member index"),
        ],
    )
    def test_problems_say_what_to_fix(self, labels: dict[str, str], count: int, says: str) -> None:
        who = membership.identity("g", count, view(job_pod("g", "p", labels=labels)))
        assert who.index == -1 and says in who.problem


class TestMembers:
    def test_failed_pod_is_remembered_until_its_index_is_taken_again(self) -> None:
        pods = [indexed("g", 0, phase="Running", gated=False, node="n0"), indexed("g", 1, phase="Failed", node="n1")]
        got = membership.members_of("g", 2, pod_index(pods))
        assert sorted(got.by_index) == [0] and sorted(got.failed) == [1]
        assert got.by_index[0].templated and got.by_index[0].controlled
        replacement = job_pod("g", "g-1-y", labels={membership.COMPLETION_INDEX: "1"})
        got = membership.members_of("g", 2, pod_index([*pods, replacement]))
        assert sorted(got.by_index) == [0, 1] and got.failed == {} and got.problems == ()

    def test_template_claims_are_read_from_the_pod_status(self) -> None:
        pod = indexed("g", 0, claims=("g-0-x-gpus-abc",))
        pod["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "g-0-x-extended-resources-q"}
        (m,) = membership.members_of("g", 1, pod_index([pod])).by_index.values()
        assert m.claims == ("g-0-x-gpus-abc", "g-0-x-extended-resources-q")


class TestApplySteps:
    def test_template_members_get_no_claim_only_narrowing_then_gates(self) -> None:
        pods = [indexed("g", 0), indexed("g", 1)]
        spec = gangspec.parse_gang_spec({"members": 2, "gpusPerMember": 4, "tensorParallelSize": 8})
        plan = writes.apply_steps(
            desired.GangRef(NS, "g", "u"),
            spec,
            decision_of({0: "nvl-0", 1: "nvl-1"}),
            membership.members_of("g", 2, pod_index(pods)),
            {},
        )
        assert [s.kind for s in plan.steps] == ["patch-pod"] * 4
        first_two = [s.body[0]["value"] for s in plan.steps[:2]]  # affinities before any gate
        hosts = [a["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] for a in first_two]
        assert [h["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] for h in hosts] == [["nvl-0"], ["nvl-1"]]
        assert all(s.why == "lift the gang gate" for s in plan.steps[2:])


class TestOwners:
    def test_failed_or_suspended_job_gives_the_gang_up(self) -> None:
        assert owners.verdict([owners.job_view(job("j", "g"))]) == owners.Verdict(False, active=True)
        failed = owners.verdict([owners.job_view(job("j", "g", failed=True))])
        assert failed.gave_up and failed.reason == events.GANG_OWNER_FAILED and "BackoffLimitExceeded" in failed.message
        assert owners.verdict([owners.job_view(job("j", "g", suspend=True))]).reason == events.GANG_OWNER_SUSPENDED

    def test_jobs_are_grouped_by_their_template_and_events_reach_the_jobset(self) -> None:
        jobs = [job("js-w-1", "g", jobset="js"), job("js-w-0", "g", jobset="js"), job("other", "h")]
        grouped = owners.jobs_by_gang(jobs)
        assert [j.name for j in grouped[f"{NS}/g"]] == ["js-w-0", "js-w-1"]
        targets = owners.event_targets(grouped[f"{NS}/g"])
        assert [(t.kind, t.name) for t in targets] == [("Job", "js-w-0"), ("JobSet", "js"), ("Job", "js-w-1")]


class TestRelease:
    def test_a_job_still_retrying_keeps_the_gang(self) -> None:
        pods = [indexed("g", 0, phase="Running", gated=False, node="n0"), indexed("g", 1, phase="Failed", node="n1")]
        m = membership.members_of("g", 2, pod_index(pods))
        assert release.verdict(owners.Verdict(False), m, 2, "Running", 1) is None

    def test_a_bare_member_that_fails_ends_the_gang(self) -> None:
        pods = [
            indexed("g", 0, phase="Running", gated=False, node="n0", controlled=False),
            indexed("g", 1, phase="Failed", node="n1", controlled=False),
        ]
        ends = release.verdict(owners.Verdict(False), membership.members_of("g", 2, pod_index(pods)), 2, "Running", 1)
        assert ends is not None and ends.reason == events.GANG_MEMBER_FAILED and "member 1" in ends.message

    def test_a_bare_member_deleted_after_start_ends_the_gang_but_not_before(self) -> None:
        pods = [indexed("g", 0, phase="Running", gated=False, node="n0", controlled=False)]
        m = membership.members_of("g", 2, pod_index(pods))
        assert release.verdict(owners.Verdict(False), m, 2, "Placed", 1) is None
        ends = release.verdict(owners.Verdict(False), m, 2, "Running", 1)
        assert ends is not None and "went away after the gang started" in ends.message

    def test_claim_shape_must_match_the_gang(self) -> None:
        spec = gangspec.parse_gang_spec({"members": 1, "gpusPerMember": 4})
        m = membership.members_of("g", 1, pod_index([indexed("g", 0, claims=("c",))]))
        assert release.shape_problems(spec, m, claim_index([template_claim("c", 4)]), NS) == []
        (problem,) = release.shape_problems(spec, m, claim_index([template_claim("c", 2)]), NS)
        assert "asks 2 device(s)" in problem and "per member" in problem


class TestWorld:
    def test_reservation_of_a_template_member_moves_to_free_gpus_of_its_node(
        self, cluster_slices: list[dict[str, Any]]
    ) -> None:
        # Member 1's claim is not allocated yet; another claim got two of the GPUs the decision named on hgx-1
        # (the scheduler may give a template member any free GPUs of its node), so the reservation must count
        # four other free GPUs of hgx-1, not the taken ones twice.
        pods = [
            indexed("g", 0, phase="Running", gated=False, node="nvl-0", claims=("c0",)),
            indexed("g", 1, claims=("c1",)),
        ]
        claims = [
            template_claim("c0", node="nvl-0", gpus=("gpu-0", "gpu-1", "gpu-2", "gpu-3")),
            template_claim("c1"),
            template_claim("foreign", 2, node="hgx-1", gpus=("gpu-0", "gpu-1")),
        ]
        gang = running_gang()
        gang["status"]["placement"] = placement_record.placement_status(decision_of({0: "nvl-0", 1: "hgx-1"}))
        w = world_of(cluster_slices, gang, pods, claims)
        base = snapshot_builder.build_view(w.slices, w.claims.values(), w.nodes, claim_gangs=w.claim_gangs())
        (r,) = world.reservations(w, base)
        assert r.placement.member == 1 and r.placement.node == "hgx-1"
        assert r.placement.gpus == ("hgx-1/gpu-2", "hgx-1/gpu-3", "hgx-1/gpu-4", "hgx-1/gpu-5")
        view = world.cluster_view(w)
        assert view.holdings[f"{NS}/g"].members[0].gpus == tuple(f"nvl-0/gpu-{k}" for k in range(4))


class TestDecide:
    def test_owner_failed_releases_and_tells_the_job(self, cluster_slices: list[dict[str, Any]]) -> None:
        pods = [
            indexed("g", 0, phase="Running", gated=False, node="nvl-0", claims=("c0",)),
            indexed("g", 1, phase="Failed", gated=False, node="nvl-1", claims=("c1",)),
        ]
        w = world_of(cluster_slices, running_gang(), pods, [], [job("g", "g", failed=True)])
        out = decide(w)
        assert out.status["phase"] == "Released" and out.status["reason"] == events.GANG_OWNER_FAILED
        assert [(s.kind, s.name) for s in out.steps] == [("delete-pod", "g-0-x")]
        assert [(r.kind, r.name, reason) for r, _, reason, _ in out.owner_events] == [
            ("Job", "g", events.GANG_OWNER_FAILED)
        ]

    def test_never_fits_is_refused_on_the_gang_and_its_job(self, cluster_slices: list[dict[str, Any]]) -> None:
        gang = gang_body("g", members=5, gpusPerMember=4, tensorParallelSize=20, selectors=[GB200])  # rack: 16
        pods = [indexed("g", i) for i in range(5)]
        w = world_of(cluster_slices, gang, pods, [], [job("g", "g")])
        out = decide(w)
        assert out.status["phase"] == "Unschedulable"
        ((ref, etype, reason, message),) = out.owner_events
        assert (ref.kind, etype, reason) == ("Job", "Warning", events.GANG_REFUSED)
        assert out.status["message"] in message

    def test_a_suspended_job_says_so_while_members_are_missing(self, cluster_slices: list[dict[str, Any]]) -> None:
        gang = gang_body("g", members=2, gpusPerMember=4, selectors=[GB200], status_={"phase": "Released"})
        w = world_of(cluster_slices, gang, [], [], [job("g", "g", suspend=True)])
        out = decide(w)
        assert out.status["phase"] == "Released"  # stays released until its pods come back
        gang["status"] = {"phase": "Pending"}
        out = decide(world_of(cluster_slices, gang, [], [], [job("g", "g", suspend=True)]))
        assert out.status["phase"] == "Pending" and "Job g is suspended" in out.status["message"]
