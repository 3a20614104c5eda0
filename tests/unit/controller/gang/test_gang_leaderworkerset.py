"""Gangs from a LeaderWorkerSet without a cluster: member index from worker-index, the LWS as the gang's owner.

Pods and LWS objects are the dicts the API returns for LWS v0.9.0 (labels and annotations as its
pod webhook and controllers write them); slices come from the real driver code on the simulator.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuplane.controller import events, names
from gpuplane.controller.gang import leaderworkersets, membership, owners, world
from gpuplane.controller.gang.podview import view
from tests.controllerkit import GB200, gang_body, pod_index
from tests.templatekit import (
    NS,
    cluster_slices_fixture,  # noqa: F401
    decide,
    indexed,
    job,
    job_pod,
    running_gang,
    world_of,
)

LWS = "tp8-lws"


def lws_pod(gang: str, worker: int, *, group: int = 0, size: int = 2, **kw: Any) -> dict[str, Any]:
    """A pod of LWS group ``group``: the leader (worker 0) from the leader StatefulSet, a worker from the group's."""
    name = f"{LWS}-{group}" if worker == 0 else f"{LWS}-{group}-{worker}"
    labels = {
        membership.LWS_NAME: LWS,
        membership.LWS_GROUP_INDEX: str(group),
        membership.LWS_WORKER_INDEX: str(worker),
    }
    pod = job_pod(gang, name, labels=labels, annotations={membership.LWS_SIZE: str(size)}, **kw)
    sts = LWS if worker == 0 else f"{LWS}-{group}"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts, "uid": f"sts-{sts}", "controller": True}
    ]
    return pod


def lws(gang: str, *, deleting: bool = False, leader_only: bool = False) -> dict[str, Any]:
    template = {"metadata": {"labels": {names.LABEL_GANG: gang}}, "spec": {}}
    lwt: dict[str, Any] = {"size": 2, "workerTemplate": {"spec": {}} if leader_only else template}
    if leader_only:
        lwt["leaderTemplate"] = template
    meta: dict[str, Any] = {"name": LWS, "namespace": NS, "uid": "uid-lws"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T20:00:00Z"
    return {
        "apiVersion": leaderworkersets.API_VERSION,
        "kind": leaderworkersets.KIND,
        "metadata": meta,
        "spec": {"replicas": 1, "leaderWorkerTemplate": lwt},
    }


def with_lws(w: world.World, *items: dict[str, Any]) -> world.World:
    return dataclasses.replace(w, leaderworkersets=leaderworkersets.by_gang(items))


class TestIdentity:
    def test_the_leader_is_member_0_and_each_worker_its_worker_index(self) -> None:
        assert membership.identity("g", 3, view(lws_pod("g", 0, size=3))) == membership.Identity(
            0, membership.MODE_TEMPLATE
        )
        assert membership.identity("g", 3, view(lws_pod("g", 2, size=3))).index == 2
        got = membership.members_of("g", 2, pod_index([lws_pod("g", 0), lws_pod("g", 1)]))
        assert sorted(got.by_index) == [0, 1] and got.problems == ()
        assert all(p.templated and p.controlled and not p.job for p in got.by_index.values())

    @pytest.mark.parametrize(
        ("pod", "members", "says"),
        [
            (lws_pod("g", 1, group=1), 2, "group 1: a GpuGang places one LWS group; give the LWS replicas: 1"),
            (lws_pod("g", 1, size=4), 2, "has size 4 (leader and workers), the gang 2 members"),
        ],
    )
    def test_problems_say_what_to_fix(self, pod: dict[str, Any], members: int, says: str) -> None:
        who = membership.identity("g", members, view(pod))
        assert who.index == -1 and says in who.problem

    def test_a_second_group_is_a_problem_not_a_member(self) -> None:
        pods = [lws_pod("g", 0), lws_pod("g", 1), lws_pod("g", 0, group=1), lws_pod("g", 1, group=1)]
        got = membership.members_of("g", 2, pod_index(pods))
        assert [p.name for _, p in sorted(got.by_index.items())] == [f"{LWS}-0", f"{LWS}-0-1"]
        assert len(got.problems) == 2 and all("replicas: 1" in p for p in got.problems)


class TestOwner:
    def test_found_by_the_worker_or_the_leader_template(self) -> None:
        assert leaderworkersets.gang_of(lws("g")) == f"{NS}/g"
        assert leaderworkersets.gang_of(lws("g", leader_only=True)) == f"{NS}/g"
        assert leaderworkersets.gang_of({"metadata": {"namespace": NS}, "spec": {"leaderWorkerTemplate": "x"}}) is None
        assert list(leaderworkersets.by_gang([lws("g"), lws("")])) == [f"{NS}/g"]

    def test_grouped_like_jobs_one_tuple_per_gang_sorted_by_name(self) -> None:
        def named(gang: str, name: str) -> dict[str, Any]:
            item = lws(gang)
            item["metadata"]["name"] = name
            return item

        grouped = leaderworkersets.by_gang([named("g", "b"), named("h", "c"), named("g", "a"), lws("")])
        assert {k: [o.name for o in v] for k, v in grouped.items()} == {
            f"{NS}/g": ["a", "b"],
            f"{NS}/h": ["c"],
        }
        assert grouped == owners.group_by_gang(grouped[f"{NS}/g"] + grouped[f"{NS}/h"])

    def test_an_lws_that_exists_keeps_the_gang_one_being_deleted_gives_it_up(self) -> None:
        assert leaderworkersets.verdict([]) == owners.STILL_TRYING
        assert leaderworkersets.verdict([leaderworkersets.view(lws("g"))]) == owners.Verdict(False, active=True)
        gone = leaderworkersets.verdict([leaderworkersets.view(lws("g", deleting=True))])
        assert gone.gave_up and gone.reason == leaderworkersets.OWNER_DELETED and gone.severity == "Normal"
        assert f"LeaderWorkerSet {LWS} is being deleted" in gone.message

    def test_a_failed_job_still_ends_a_gang_that_also_has_an_lws(self) -> None:
        failed = owners.verdict([owners.job_view(job("j", "g", failed=True))])
        assert leaderworkersets.combined(failed, leaderworkersets.verdict([leaderworkersets.view(lws("g"))])) == failed
        both = leaderworkersets.combined(
            owners.STILL_TRYING, leaderworkersets.verdict([leaderworkersets.view(lws("g"))])
        )
        assert both.active and not both.gave_up


class TestDecide:
    def test_a_placed_gang_waits_while_its_lws_recreates_the_group(self, cluster_slices: list[dict[str, Any]]) -> None:
        # LWS deleted the group after a pod restarted; no pod exists for a moment. The gang keeps its placement.
        w = with_lws(world_of(cluster_slices, running_gang(), [], []), lws("g"))
        out = decide(w)
        assert out.status["phase"] == "Placing" and out.status.get("placement", "kept") is not None
        assert [s.kind for s in out.steps] == ["wait"], "nothing deleted, the placement kept: it waits for the pods"
        assert out.status["domain"]
        # Without an LWS (nothing will make the pods again) the same gang is over.
        out = decide(world_of(cluster_slices, running_gang(), [], []))
        assert out.status["phase"] == "Released" and out.status["reason"] == "MembersGone"

    def test_no_member_claim_is_made_for_a_template_member_whose_pod_is_gone(
        self, cluster_slices: list[dict[str, Any]]
    ) -> None:
        # The same for a Job replacing a deleted member: no stray <gang>-1 claim while its replacement is missing
        # (it would be made for nothing: the replacement's claim comes from its template).
        pods = [indexed("g", 0, phase="Running", gated=False, node="nvl-0", claims=("c0",))]
        out = decide(world_of(cluster_slices, running_gang(), pods, [], [job("g", "g")]))
        assert [s.kind for s in out.steps] == ["wait"] and "member 1 has no pod" in out.status["message"]

    def test_the_recreated_group_is_narrowed_to_its_members_nodes_then_ungated(
        self, cluster_slices: list[dict[str, Any]]
    ) -> None:
        pods = [lws_pod("g", 0), lws_pod("g", 1)]  # gated, from the templates
        out = decide(with_lws(world_of(cluster_slices, running_gang(), pods, []), lws("g")))
        assert out.status["phase"] == "Placing"
        narrow = [s for s in out.steps if s.why != "lift the gang gate"]
        hosts = {
            s.name: s.body[0]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ][0]["matchExpressions"][0]["values"]
            for s in narrow
        }
        assert hosts == {f"{LWS}-0": ["nvl-0"], f"{LWS}-0-1": ["nvl-1"]}  # leader = member 0, worker = member 1
        assert [s.kind for s in out.steps].count("patch-pod") == 4

    def test_deleting_the_lws_releases_the_gang(self, cluster_slices: list[dict[str, Any]]) -> None:
        pods = [lws_pod("g", i, phase="Running", gated=False, node=f"nvl-{i}") for i in range(2)]
        out = decide(with_lws(world_of(cluster_slices, running_gang(), pods, []), lws("g", deleting=True)))
        assert out.status["phase"] == "Released" and out.status["reason"] == leaderworkersets.OWNER_DELETED
        assert "the gang's devices are released" in out.status["message"]
        assert sorted((s.kind, s.name) for s in out.steps) == [("delete-pod", f"{LWS}-0"), ("delete-pod", f"{LWS}-0-1")]
        assert ("Normal", leaderworkersets.OWNER_DELETED) in [(e[0], e[1]) for e in out.events]
        assert out.owner_events == ()  # not a failure: nothing to tell the LWS that is going away

    def test_never_fits_is_refused_on_the_lws(self, cluster_slices: list[dict[str, Any]]) -> None:
        gang = gang_body("g", members=5, gpusPerMember=4, tensorParallelSize=20, selectors=[GB200])  # rack: 16
        pods = [lws_pod("g", i, size=5) for i in range(5)]
        out = decide(with_lws(world_of(cluster_slices, gang, pods, []), lws("g")))
        assert out.status["phase"] == "Unschedulable"
        ((ref, etype, reason, message),) = out.owner_events
        assert (ref.api_version, ref.kind, ref.name, etype, reason) == (
            leaderworkersets.API_VERSION,
            "LeaderWorkerSet",
            LWS,
            "Warning",
            events.GANG_REFUSED,
        )
        assert out.status["message"] in message
