"""Gangs from templates without a cluster: member indices, template members' steps, owners, failure semantics.

Slices come from the real driver code on the simulator (the builders of
``test_controller_gangs``); pods and Jobs are the dicts the API would return.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpuplane.controller import events, names
from gpuplane.controller.gang import desired, membership, owners, placement_record, queue_runner, release, world, writes
from gpuplane.controller.gang import reconciler as gang_reconciler
from gpuplane.controller.gang import spec as gangspec
from gpuplane.controller.node import snapshot_builder
from gpuplane.controller.placement import model
from gpuplane.controller.placement.policies import make as make_policy
from tests.controllerkit import GB200, GPU_CLASS, T0, gang_body, node_slices

NS = "team-a"


@pytest.fixture(scope="module")
def cluster_slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two HGX H100 nodes and four GB200 trays of one rack, as the real driver publishes them."""
    tmp = tmp_path_factory.mktemp("sim")
    out: list[dict[str, Any]] = []
    for i in range(2):
        out += node_slices(tmp, f"hgx-{i}", "hgx-h100")
    for i in range(4):
        out += node_slices(tmp, f"nvl-{i}", "gb200-nvl72", clique=1)
    return out


def job_pod(
    gang: str,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str = "Pending",
    gated: bool = True,
    node: str = "",
    claims: tuple[str, ...] = (),
    controlled: bool = True,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "labels": {names.LABEL_GANG: gang, **(labels or {})},
        "annotations": dict(annotations or {}),
    }
    if controlled:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": gang, "controller": True}]
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "four"}],
        "schedulingGates": [{"name": names.SCHEDULING_GATE}] if gated else [],
    }
    if node:
        spec["nodeName"] = node
    st: dict[str, Any] = {"phase": phase}
    if claims:
        st["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": c} for c in claims]
    return {"metadata": meta, "spec": spec, "status": st}


def indexed(gang: str, i: int, **kw: Any) -> dict[str, Any]:
    return job_pod(gang, f"{gang}-{i}-x", labels={membership.COMPLETION_INDEX: str(i)}, **kw)


def job(name: str, gang: str, *, failed: bool = False, suspend: bool = False, jobset: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}"}
    if jobset:
        meta["ownerReferences"] = [
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "name": jobset,
                "uid": "js",
                "controller": True,
            }
        ]
    conditions = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"suspend": suspend, "template": {"metadata": {"labels": {names.LABEL_GANG: gang}}}},
        "status": {"conditions": conditions if failed else []},
    }


def template_claim(name: str, count: int = 4, *, node: str = "", gpus: tuple[str, ...] = ()) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.gpuplane.dev", "count": count}}]
            }
        },
        "status": {},
    }
    if node:
        claim["status"]["allocation"] = {
            "devices": {"results": [{"driver": "gpu.gpuplane.dev", "pool": node, "device": g} for g in gpus]}
        }
    return claim


class TestIdentity:
    def test_named_claim_wins(self) -> None:
        pod = {"metadata": {"name": "p"}, "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "tp8-3"}]}}
        assert membership.identity("tp8", 4, pod) == membership.Identity(3, membership.MODE_NAMED)

    def test_label_then_completion_index(self) -> None:
        pod = job_pod("g", "p", labels={names.LABEL_MEMBER_INDEX: "2", membership.COMPLETION_INDEX: "0"})
        assert membership.identity("g", 4, pod) == membership.Identity(2, membership.MODE_TEMPLATE)
        pod = job_pod("g", "p", annotations={membership.COMPLETION_INDEX: "1"})
        assert membership.identity("g", 4, pod).index == 1

    def test_jobset_global_index_times_pods_per_job(self) -> None:
        labels = {
            membership.JOBSET_GLOBAL_INDEX: "1",
            membership.JOBSET_GLOBAL_REPLICAS: "2",
            membership.COMPLETION_INDEX: "1",
        }
        assert membership.identity("g", 4, job_pod("g", "p", labels=labels)).index == 3  # 1 x 2 + 1

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
        who = membership.identity("g", count, job_pod("g", "p", labels=labels))
        assert who.index == -1 and says in who.problem


class TestMembers:
    def test_failed_pod_is_remembered_until_its_index_is_taken_again(self) -> None:
        pods = [indexed("g", 0, phase="Running", gated=False, node="n0"), indexed("g", 1, phase="Failed", node="n1")]
        got = membership.members_of("g", 2, pods)
        assert sorted(got.by_index) == [0] and sorted(got.failed) == [1]
        assert got.by_index[0].templated and got.by_index[0].controlled
        replacement = job_pod("g", "g-1-y", labels={membership.COMPLETION_INDEX: "1"})
        got = membership.members_of("g", 2, [*pods, replacement])
        assert sorted(got.by_index) == [0, 1] and got.failed == {} and got.problems == ()

    def test_template_claims_are_read_from_the_pod_status(self) -> None:
        pod = indexed("g", 0, claims=("g-0-x-gpus-abc",))
        pod["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "g-0-x-extended-resources-q"}
        (m,) = membership.members_of("g", 1, [pod]).by_index.values()
        assert m.claims == ("g-0-x-gpus-abc", "g-0-x-extended-resources-q")


def _decision(nodes: dict[int, str]) -> model.Decision:
    return model.Decision(
        request_id="team-a/g",
        members=tuple(
            model.MemberPlacement(member=i, node=n, domain="d", gpus=tuple(f"{n}/gpu-{k}" for k in range(4)))
            for i, n in sorted(nodes.items())
        ),
    )


class TestApplySteps:
    def test_template_members_get_no_claim_only_narrowing_then_gates(self) -> None:
        pods = [indexed("g", 0), indexed("g", 1)]
        spec = gangspec.parse_gang_spec({"members": 2, "gpusPerMember": 4, "tensorParallelSize": 8})
        plan = writes.apply_steps(
            desired.GangRef(NS, "g", "u"),
            spec,
            _decision({0: "nvl-0", 1: "nvl-1"}),
            membership.members_of("g", 2, pods),
            {},
        )
        assert [s.kind for s in plan.steps] == ["patch-pod"] * 4
        first_two = [s.body[0]["value"] for s in plan.steps[:2]]  # affinities before any gate
        hosts = [a["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] for a in first_two]
        assert [h["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] for h in hosts] == [["nvl-0"], ["nvl-1"]]
        assert all(s.why == "lift the gang gate" for s in plan.steps[2:])


class TestOwners:
    def test_failed_or_suspended_job_gives_the_gang_up(self) -> None:
        assert owners.verdict([job("j", "g")]) == owners.Verdict(False)
        failed = owners.verdict([job("j", "g", failed=True)])
        assert failed.gave_up and failed.reason == events.GANG_OWNER_FAILED and "BackoffLimitExceeded" in failed.message
        assert owners.verdict([job("j", "g", suspend=True)]).reason == events.GANG_OWNER_SUSPENDED

    def test_jobs_are_grouped_by_their_template_and_events_reach_the_jobset(self) -> None:
        jobs = [job("js-w-1", "g", jobset="js"), job("js-w-0", "g", jobset="js"), job("other", "h")]
        grouped = owners.jobs_by_gang(jobs)
        assert [j["metadata"]["name"] for j in grouped[f"{NS}/g"]] == ["js-w-0", "js-w-1"]
        targets = owners.event_targets(grouped[f"{NS}/g"])
        assert [(t.kind, t.name) for t in targets] == [("Job", "js-w-0"), ("JobSet", "js"), ("Job", "js-w-1")]


class TestRelease:
    def test_a_job_still_retrying_keeps_the_gang(self) -> None:
        pods = [indexed("g", 0, phase="Running", gated=False, node="n0"), indexed("g", 1, phase="Failed", node="n1")]
        m = membership.members_of("g", 2, pods)
        assert release.verdict(owners.Verdict(False), m, 2, "Running", 1) is None

    def test_a_bare_member_that_fails_ends_the_gang(self) -> None:
        pods = [
            indexed("g", 0, phase="Running", gated=False, node="n0", controlled=False),
            indexed("g", 1, phase="Failed", node="n1", controlled=False),
        ]
        ends = release.verdict(owners.Verdict(False), membership.members_of("g", 2, pods), 2, "Running", 1)
        assert ends is not None and ends.reason == events.GANG_MEMBER_FAILED and "member 1" in ends.message

    def test_a_bare_member_deleted_after_start_ends_the_gang_but_not_before(self) -> None:
        pods = [indexed("g", 0, phase="Running", gated=False, node="n0", controlled=False)]
        m = membership.members_of("g", 2, pods)
        assert release.verdict(owners.Verdict(False), m, 2, "Placed", 1) is None
        ends = release.verdict(owners.Verdict(False), m, 2, "Running", 1)
        assert ends is not None and "went away after the gang started" in ends.message

    def test_claim_shape_must_match_the_gang(self) -> None:
        spec = gangspec.parse_gang_spec({"members": 1, "gpusPerMember": 4})
        m = membership.members_of("g", 1, [indexed("g", 0, claims=("c",))])
        assert release.shape_problems(spec, m, {f"{NS}/c": template_claim("c", 4)}, NS) == []
        (problem,) = release.shape_problems(spec, m, {f"{NS}/c": template_claim("c", 2)}, NS)
        assert "asks 2 device(s)" in problem and "per member" in problem


def _world(
    slices: list[dict[str, Any]],
    gang: dict[str, Any],
    pods: list[dict[str, Any]],
    claims: list[dict[str, Any]],
    jobs: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> world.World:
    nodes = {s["spec"]["nodeName"]: True for s in slices if s["spec"].get("nodeName")}
    return world.World(
        gangs={f"{NS}/{gang['metadata']['name']}": gang},
        pods=world.member_lists(pods),
        claims={f"{NS}/{c['metadata']['name']}": c for c in claims},
        slices=tuple(slices),
        nodes=nodes,
        classes={"gpu.gpuplane.dev": GPU_CLASS},
        jobs=owners.jobs_by_gang(jobs),
    )


def _running_gang() -> dict[str, Any]:
    placement = placement_record.placement_status(_decision({0: "nvl-0", 1: "nvl-1"}))
    return gang_body(
        "g",
        members=2,
        gpusPerMember=4,
        tensorParallelSize=8,
        selectors=[GB200],
        status_={"phase": "Running", "placement": placement, "domain": "d"},
    )


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
        gang = _running_gang()
        gang["status"]["placement"] = placement_record.placement_status(_decision({0: "nvl-0", 1: "hgx-1"}))
        w = _world(cluster_slices, gang, pods, claims)
        base = snapshot_builder.build_view(w.slices, w.claims.values(), w.nodes, claim_gangs=w.claim_gangs())
        (r,) = world.reservations(w, base)
        assert r.placement.member == 1 and r.placement.node == "hgx-1"
        assert r.placement.gpus == ("hgx-1/gpu-2", "hgx-1/gpu-3", "hgx-1/gpu-4", "hgx-1/gpu-5")
        view = world.cluster_view(w)
        assert view.holdings[f"{NS}/g"].members[0].gpus == tuple(f"nvl-0/gpu-{k}" for k in range(4))


class TestDecide:
    def _decide(self, w: world.World, key: str = f"{NS}/g") -> gang_reconciler.Outcome:
        view = world.cluster_view(w)
        plan = queue_runner.plan(
            world.entries(w, view),
            view,
            lambda e: world.admit_for(w, e.spec).predicate,
            make_policy("gpuplane"),
            now=T0 + 10,
        )
        return gang_reconciler.decide(
            key, w.gangs[key], w, view=view, plan=plan, now=T0 + 10, settings=gang_reconciler.Settings()
        )

    def test_owner_failed_releases_and_tells_the_job(self, cluster_slices: list[dict[str, Any]]) -> None:
        pods = [
            indexed("g", 0, phase="Running", gated=False, node="nvl-0", claims=("c0",)),
            indexed("g", 1, phase="Failed", gated=False, node="nvl-1", claims=("c1",)),
        ]
        w = _world(cluster_slices, _running_gang(), pods, [], [job("g", "g", failed=True)])
        out = self._decide(w)
        assert out.status["phase"] == "Released" and out.status["reason"] == events.GANG_OWNER_FAILED
        assert [(s.kind, s.name) for s in out.steps] == [("delete-pod", "g-0-x")]
        assert [(r.kind, r.name, reason) for r, _, reason, _ in out.owner_events] == [
            ("Job", "g", events.GANG_OWNER_FAILED)
        ]

    def test_never_fits_is_refused_on_the_gang_and_its_job(self, cluster_slices: list[dict[str, Any]]) -> None:
        gang = gang_body("g", members=5, gpusPerMember=4, tensorParallelSize=20, selectors=[GB200])  # rack: 16
        pods = [indexed("g", i) for i in range(5)]
        w = _world(cluster_slices, gang, pods, [], [job("g", "g")])
        out = self._decide(w)
        assert out.status["phase"] == "Unschedulable"
        ((ref, etype, reason, message),) = out.owner_events
        assert (ref.kind, etype, reason) == ("Job", "Warning", events.GANG_REFUSED)
        assert out.status["message"] in message

    def test_a_suspended_job_says_so_while_members_are_missing(self, cluster_slices: list[dict[str, Any]]) -> None:
        gang = gang_body("g", members=2, gpusPerMember=4, selectors=[GB200], status_={"phase": "Released"})
        w = _world(cluster_slices, gang, [], [], [job("g", "g", suspend=True)])
        out = self._decide(w)
        assert out.status["phase"] == "Released"  # stays released until its pods come back
        gang["status"] = {"phase": "Pending"}
        out = self._decide(_world(cluster_slices, gang, [], [], [job("g", "g", suspend=True)]))
        assert out.status["phase"] == "Pending" and "Job g is suspended" in out.status["message"]
