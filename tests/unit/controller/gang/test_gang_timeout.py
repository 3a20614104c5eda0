"""A template gang that times out is given up for good: its Jobs are suspended, told why, and nothing stays gated.

Before, its member pods were deleted like hand-written ones; the Job made them again, gated
for a gang that was ``TimedOut`` and would never place them, and nobody said so on the Job.
Also: a placed gang whose pods are all gone while its Job is still active waits for the Job's
verdict (a Job about to fail deletes the other pods before its status says it failed).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.controller import events, kube, steps
from gpuplane.controller.gang import desired, membership, owners, release
from gpuplane.informer.client import MERGE
from testing.kubeapi import FakeApi
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

QUEUED = {"phase": "Queued", "reason": "Queued", "message": "waiting for room"}


def _timing_out(status_: dict[str, Any] | None = None) -> dict[str, Any]:
    return gang_body("g", members=2, gpusPerMember=4, timeoutSeconds=5, selectors=[GB200], status_=status_ or QUEUED)


def _resumed(j: dict[str, Any]) -> dict[str, Any]:
    """A Job the user resumed after it was suspended (the Job controller's condition)."""
    j["status"]["conditions"].append({"type": "Suspended", "status": "False", "reason": "JobResumed"})
    return j


class TestTimedOutTemplateGang:
    def test_its_job_is_suspended_and_told_not_its_pods_deleted(self, cluster_slices: list[dict[str, Any]]) -> None:
        pods = [indexed("g", 0), indexed("g", 1)]
        out = decide(world_of(cluster_slices, _timing_out(), pods, [], [job("g", "g")]))
        assert out.status["phase"] == "TimedOut"
        # The Job controller deletes its own pods once suspended (not counted as failures) and makes no more.
        assert [(s.kind, s.name) for s in out.steps] == [("suspend-job", "g")]
        assert "not scheduled within 5s" in out.status["message"]
        assert "Job g suspended" in out.status["message"] and '"suspend":false' in out.status["message"]
        ((ref, etype, reason, message),) = out.owner_events
        assert (ref.kind, ref.name, etype, reason) == ("Job", "g", "Warning", events.GANG_OWNER_TIMED_OUT)
        assert out.status["message"] in message
        assert ("Warning", "Timeout", out.status["message"]) in out.events

    def test_a_jobset_is_suspended_once_for_all_its_jobs(self, cluster_slices: list[dict[str, Any]]) -> None:
        pods = [job_pod("g", "js-w-0-0", labels={membership.COMPLETION_INDEX: "0"}), indexed("g", 1)]
        jobs = [job("js-w-0", "g", jobset="js"), job("js-w-1", "g", jobset="js")]
        out = decide(world_of(cluster_slices, _timing_out(), pods, [], jobs))
        suspends = [(s.kind, s.name) for s in out.steps if s.kind.startswith("suspend-")]
        assert suspends == [("suspend-jobset", "js")]
        assert "JobSet js suspended" in out.status["message"]
        assert {(r.kind, r.name) for r, *_ in out.owner_events} == {
            ("Job", "js-w-0"),
            ("Job", "js-w-1"),
            ("JobSet", "js"),
        }

    def test_pods_no_suspended_job_makes_are_still_deleted(self) -> None:
        bare = indexed("g", 1, controlled=False)
        members = membership.members_of("g", 2, pod_index([indexed("g", 0), bare]))
        ref = desired.GangRef(NS, "g", "u")
        stop = release.timeout_steps(
            ref, members, ["g-0"], [owners.job_view(job("g", "g"))], grace_seconds=0, why="late"
        )
        assert [(s.kind, s.name) for s in stop.steps] == [
            ("suspend-job", "g"),
            ("delete-pod", bare["metadata"]["name"]),
            ("delete-claim", "g-0"),
        ]

    def test_without_jobs_it_is_released_as_before(self, cluster_slices: list[dict[str, Any]]) -> None:
        pods = [indexed("g", 0, controlled=False), indexed("g", 1, controlled=False)]
        out = decide(world_of(cluster_slices, _timing_out(), pods, []))
        assert out.status["phase"] == "TimedOut" and not out.owner_events
        assert [s.kind for s in out.steps] == ["delete-pod", "delete-pod"]
        assert "suspended" not in out.status["message"]

    def test_while_timed_out_a_job_never_suspended_is_suspended_again_a_resumed_one_is_not(
        self, cluster_slices: list[dict[str, Any]]
    ) -> None:
        timed_out = {"phase": "TimedOut", "reason": "Timeout", "message": "not scheduled within 5s"}
        pods = [indexed("g", 0), indexed("g", 1)]
        # The suspension failed (or the Job came later): the next reconcile writes it again, and nothing else.
        out = decide(world_of(cluster_slices, _timing_out(timed_out), pods, [], [job("g", "g")]))
        assert out.status["phase"] == "TimedOut" and [(s.kind, s.name) for s in out.steps] == [("suspend-job", "g")]
        assert not out.owner_events  # told once, when it timed out
        resumed = _resumed(job("g", "g"))
        out = decide(world_of(cluster_slices, _timing_out(timed_out), pods, [], [resumed]))
        assert out.status["phase"] == "TimedOut" and out.steps == ()
        suspended = job("g", "g", suspend=True)
        assert decide(world_of(cluster_slices, _timing_out(timed_out), [], [], [suspended])).steps == ()


class TestAllPodsGoneWhileTheJobIsActive:
    def test_the_job_decides_not_the_missing_pods(self, cluster_slices: list[dict[str, Any]]) -> None:
        # The Job's pods are gone, but this replica's Job watch does not show it failed yet: wait for it.
        out = decide(world_of(cluster_slices, running_gang(), [], [], [job("g", "g")]))
        assert out.status["phase"] != "Released" and out.status["reason"] != "MembersGone", out.status
        out = decide(world_of(cluster_slices, running_gang(), [], [], [job("g", "g", failed=True)]))
        assert (out.status["phase"], out.status["reason"]) == ("Released", events.GANG_OWNER_FAILED)

    def test_a_completed_job_ends_the_gang(self, cluster_slices: list[dict[str, Any]]) -> None:
        done = job("g", "g")
        done["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
        assert owners.verdict([owners.job_view(done)]) == owners.STILL_TRYING
        out = decide(world_of(cluster_slices, running_gang(), [], [], [done]))
        assert (out.status["phase"], out.status["reason"]) == ("Released", "MembersGone")


def test_the_writer_suspends_a_job_or_jobset_by_merge_patch_and_a_gone_one_is_done() -> None:
    job_path, jobset_path = (
        f"/apis/batch/v1/namespaces/{NS}/jobs/j",
        f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets/js",
    )
    api = FakeApi({job_path: {"spec": {"parallelism": 2}}, jobset_path: {"spec": {}}})
    writer = kube.KubeWriter(api)
    writer.run(NS, steps.Step("suspend-job", "j"))
    writer.run(NS, steps.Step("suspend-jobset", "js"))
    assert [(c.method, c.path, c.body, c.content_type) for c in api.calls] == [
        ("PATCH", job_path, {"spec": {"suspend": True}}, MERGE),
        ("PATCH", jobset_path, {"spec": {"suspend": True}}, MERGE),
    ]
    assert api.objects[job_path] == {"spec": {"parallelism": 2, "suspend": True}}
    writer.run(NS, steps.Step("suspend-job", "gone"))  # 404: nothing left to stop
    with pytest.raises(kube.StepFailed, match="403"):
        kube.KubeWriter(FakeApi(fail={("PATCH", job_path): 403})).run(NS, steps.Step("suspend-job", "j"))
