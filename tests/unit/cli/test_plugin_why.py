"""``kubectl gpuplane why``'s answer (gpuplane.cli.why): the verdict, and what each component said, from API dicts."""

from __future__ import annotations

from typing import Any

from gpuplane.cli import why
from gpuplane.controller import names


def claim(name: str, *, allocated: bool = False, notes: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {"results": [{"driver": "gpu.gpuplane.dev", "pool": "n1", "device": "gpu-2", "request": "gpu"}]}
        }
        status["reservedFor"] = [{"resource": "pods", "name": "p"}]
        status["devices"] = [
            {
                "driver": "gpu.gpuplane.dev",
                "pool": "n1",
                "device": "gpu-2",
                "data": {
                    "kind": "gpu",
                    "uuid": "GPU-1",
                    "sharing": {"strategy": "MPS", "mpsActiveThreadPercentage": 60},
                },
            }
        ]
    return {"metadata": {"namespace": "ns", "name": name, "annotations": notes or {}}, "status": status}


def pod(phase: str, unschedulable: str = "") -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}]
    return {
        "metadata": {"namespace": "ns", "name": "p"},
        "spec": {"nodeName": "n1" if phase == "Running" else None},
        "status": {"phase": phase, "conditions": conditions if unschedulable else []},
    }


def event(reason: str, message: str, at: str, kind: str = "Pod") -> dict[str, Any]:
    return {
        "type": "Warning",
        "reason": reason,
        "message": message,
        "lastTimestamp": at,
        "count": 3,
        "involvedObject": {"kind": kind, "name": "p"},
    }


def test_the_keys_are_the_controllers() -> None:
    assert why.UNALLOCATED == names.ANNOTATION_EXPLAINED
    assert why.CONFIG_ERROR == names.ANNOTATION_CONFIG_ERROR
    assert why.NVLINK_WARNING == names.ANNOTATION_DOMAIN_WARNING


def test_a_running_pod_says_what_it_got() -> None:
    lines = why.render([claim("c", allocated=True)], pod("Running"), [])
    assert lines[0] == "why: running: every claim was allocated and prepared"
    assert "pod ns/p: Running on n1" in lines
    assert "  allocated: n1/gpu-2 (reserved for: p)" in lines
    assert "  got gpu-2: gpu GPU-1, MPS, mpsActiveThreadPercentage 60" in lines


def test_the_verdict_names_the_first_place_to_look() -> None:
    bad = claim("c", notes={why.CONFIG_ERROR: "sharing.mps.activeThreadPercentage: 300 is above 100"})
    assert why.verdict([bad], pod("Pending"), []) == (
        "fix the claim's configuration: sharing.mps.activeThreadPercentage: 300 is above 100"
    )
    refused = [event("FailedPrepareDynamicResources", "MIG mode change needs a GPU reset", "2026-12-05T10:00:00Z")]
    assert why.verdict([claim("c", allocated=True)], pod("Pending"), refused).startswith(
        "the node's driver refused to prepare a claim: MIG mode change"
    )
    waiting = claim("c", notes={why.UNALLOCATED: "no node offers 4 GB200 GPUs in one NVLink domain"})
    assert why.verdict([waiting], pod("Pending", "0/6 nodes are available"), []) == (
        "no device fits the claim now: no node offers 4 GB200 GPUs in one NVLink domain"
    )
    assert why.verdict([claim("c")], pod("Pending", "0/6 nodes are available: cannot allocate all claims"), []) == (
        "kube-scheduler cannot place the pod: 0/6 nodes are available: cannot allocate all claims"
    )
    assert why.verdict([claim("c")], None, []).startswith("waiting for kube-scheduler")


def test_events_are_the_newest_oldest_first_and_gates_are_named() -> None:
    events = [event("E", f"m{i}", f"2026-12-05T10:00:{i:02d}Z") for i in range(20)]
    lines = why.event_lines(events, limit=3)
    assert [line.split()[-1] for line in lines] == ["m17", "m18", "m19"]
    assert "Warning E x3 pod/p: m19" in lines[-1]
    gated = pod("Pending")
    gated["spec"]["schedulingGates"] = [{"name": "gpuplane.dev/gang"}]
    assert any("held by scheduling gates: gpuplane.dev/gang" in line for line in why.pod_lines(gated))


def test_hostile_fields_do_not_crash_it() -> None:
    odd: dict[str, Any] = {
        "metadata": "x",
        "status": {"allocation": {"devices": {"results": ["y", 3]}}, "devices": [1]},
    }
    lines = why.render([odd], {"status": {"conditions": ["z"]}, "spec": []}, [{"involvedObject": "q"}])
    assert lines[0].startswith("why: ") and any(line.startswith("claim ?/?") for line in lines)
