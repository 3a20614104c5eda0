"""What deleting a GpuGang writes (issue 18, defect 7, second item): the rules of gang.deleted.

The cluster behaviour (member pods told and gone, devices free for the next gang) is the e2e
``tests/e2e/test_gang_deletion.py``; here, on the controller's own world model, which writes and
Events each kind of gang gets: hand-written members deleted mid-placement or while Running, a
Job's members left to their suspended Job, nothing for a gang with nothing left.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.controller import events
from gpuplane.controller.gang import deleted, owners, world
from gpuplane.controller.gang.desired import GangRef
from gpuplane.controller.steps import Step
from tests.controllerkit import claim_index, holding, member_pod, pod_index
from tests.templatekit import NS, indexed, job

REF = GangRef(NS, "g", "uid-g")


def _claims(w: world.World, key: str) -> list[str]:
    return [c for c, e in w.gang_claims(key).items() if e.owned]


def test_a_running_hand_written_gang_tells_then_deletes_every_member_and_its_claims() -> None:
    _body, pods, claims = holding("g", NS, 0, ["hgx-0", "hgx-1"], 0.0)
    w = world.World(
        gangs={}, pods=world.member_lists(pod_index(pods)), claims=claim_index(claims), slices=(), nodes={}, classes={}
    )
    d = deleted.deletion(REF, "Running", w.pods[f"{NS}/g"], _claims(w, f"{NS}/g"), (), grace_seconds=5)
    assert [(s.kind, s.name, s.body) for s in d.steps] == [
        ("delete-pod", "g-pod-0", 5),
        ("delete-pod", "g-pod-1", 5),
        ("delete-claim", "g-0", None),
        ("delete-claim", "g-1", None),
    ]
    assert [(t.kind, t.name, t.uid, etype, reason) for t, etype, reason, _ in d.told] == [
        ("Pod", "g-pod-0", "pod-g-0", "Warning", deleted.REASON),
        ("Pod", "g-pod-1", "pod-g-1", "Warning", deleted.REASON),
    ]
    text = d.told[0][3]
    assert f"GpuGang {NS}/g was deleted while Running" in text and "this pod is deleted" in text
    assert "create GpuGang g and its member pods again" in text
    assert all(s.why.startswith(f"GpuGang {NS}/g was deleted") for s in d.steps)


def test_a_gang_deleted_mid_placement_releases_gated_and_ungated_members() -> None:
    pods = [member_pod("g", 0, ns=NS, gated=False), member_pod("g", 1, ns=NS, gated=True)]
    d = deleted.deletion(REF, "Placing", pod_index(pods), ["g-0"], (), grace_seconds=None)
    assert [(s.kind, s.name) for s in d.steps] == [
        ("delete-pod", "g-pod-0"),
        ("delete-pod", "g-pod-1"),
        ("delete-claim", "g-0"),
    ]
    assert d.pods_told == 2 and "while Placing" in d.told[1][3]


def test_a_jobs_members_are_left_to_their_suspended_job_and_the_job_is_told() -> None:
    pods = [indexed("g", 0), indexed("g", 1, gated=False, node="nvl-0")]
    jobs = owners.jobs_by_gang([job("g", "g")])[f"{NS}/g"]
    d = deleted.deletion(REF, "Placed", pod_index(pods), [], jobs, grace_seconds=None)
    assert [(s.kind, s.name) for s in d.steps] == [("suspend-job", "g")]
    by_kind: dict[str, list[tuple[events.ObjectRef, str]]] = {}
    for target, _etype, _reason, text in d.told:
        by_kind.setdefault(target.kind, []).append((target, text))
    assert [t.name for t, _ in by_kind["Pod"]] == ["g-0-x", "g-1-x"]
    assert all("its Job g is suspended, which deletes it" in text for _, text in by_kind["Pod"])
    ((job_ref, job_text),) = by_kind["Job"]
    assert job_ref.name == "g" and "Job g suspended" in job_text


@pytest.mark.parametrize("phase", ["", "Queued", "Released"])
def test_nothing_left_nothing_written(phase: str) -> None:
    finished = member_pod("g", 0, ns=NS)
    finished["status"]["phase"] = "Succeeded"
    d = deleted.deletion(REF, phase, pod_index([finished]), [], (), grace_seconds=None)
    assert d.steps == () and d.told == ()


class _Writer:
    def __init__(self, failing: str) -> None:
        self.failing = failing
        self.ran: list[str] = []
        self.events: list[str] = []

    def run(self, namespace: str, step: Step) -> None:
        if step.name == self.failing:
            raise RuntimeError("connection reset")
        self.ran.append(f"{step.kind} {step.name}")

    def event(self, ref: events.ObjectRef, kind: events.EventType, reason: str, message: str) -> None:
        self.events.append(f"{ref.kind} {ref.name} {reason}")


def test_end_tells_first_and_a_failed_write_does_not_stop_the_rest() -> None:
    pods: list[dict[str, Any]] = [member_pod("g", i, ns=NS) for i in range(3)]
    d = deleted.deletion(REF, "Queued", pod_index(pods), ["g-0"], (), grace_seconds=None)
    writer = _Writer(failing="g-pod-1")
    failed = deleted.end(writer, writer, NS, d)
    assert writer.events == [f"Pod g-pod-{i} {deleted.REASON}" for i in range(3)]
    assert writer.ran == ["delete-pod g-pod-0", "delete-pod g-pod-2", "delete-claim g-0"]
    assert failed == ["delete-pod g-pod-1: connection reset"]
