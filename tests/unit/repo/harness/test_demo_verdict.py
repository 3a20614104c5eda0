"""The demo's verdict: each example against the state it exists to show; the order that keeps examples independent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from e2e.plane import demo, demo_verdict

FIXTURES = Path(__file__).resolve().parents[3] / "e2e" / "fixtures"


def pod(namespace: str, name: str, phase: str, scheduled: str = "True", *, reason: str = "", message: str = "") -> Any:
    condition = {"type": "PodScheduled", "status": scheduled, "reason": reason, "message": message}
    return {"metadata": {"namespace": namespace, "name": name}, "status": {"phase": phase, "conditions": [condition]}}


def event(namespace: str, name: str, reason: str, message: str, when: str) -> Any:
    return {
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name},
        "type": "Warning",
        "reason": reason,
        "message": message,
        "lastTimestamp": when,
    }


UNSCHEDULABLE = "0/6 nodes are available: 4 cannot allocate all claims"


def test_running_examples_and_a_pending_unsatisfiable_pass() -> None:
    findings = demo_verdict.judge(
        {
            "whole-gpu": [pod("ex-whole", "a", "Running"), pod("ex-whole", "b", "Running")],
            "unsatisfiable": [
                pod("ex-un", "too-big", "Pending", "False", reason="Unschedulable", message=UNSCHEDULABLE)
            ],
        }
    )
    assert findings == []
    assert demo_verdict.render(findings, 2) == ["verdict: all 2 examples reached their expected state"]


def test_a_pending_example_is_a_finding_with_the_schedulers_reason_the_newest_event_and_next_step() -> None:
    stuck = pod("ex-mps", "bronze-batch", "Pending", "False", reason="Unschedulable", message=UNSCHEDULABLE)
    events = [
        event("ex-mps", "bronze-batch", "FailedScheduling", "older", "2026-12-05T10:00:00Z"),
        event("ex-mps", "bronze-batch", "FailedScheduling", "newer", "2026-12-05T10:01:00Z"),
        event("ex-mps", "gold-inference", "Scheduled", "elsewhere", "2026-12-05T10:02:00Z"),
    ]
    findings = demo_verdict.judge({"mps-tiers": [pod("ex-mps", "gold-inference", "Running"), stuck]}, events)
    assert findings == [
        demo_verdict.Finding(
            "mps-tiers",
            "ex-mps/bronze-batch",
            "Running",
            "Pending (unschedulable)",
            scheduler=UNSCHEDULABLE,
            event="Warning FailedScheduling: newer",
        )
    ]
    lines = demo_verdict.render(findings, 15)
    assert lines[0] == "verdict: FAILED: 1 of 15 examples missed their expected state: mps-tiers"
    assert lines[1] == "  mps-tiers: pod ex-mps/bronze-batch is Pending (unschedulable), expected Running"
    assert lines[2] == f"    scheduler: {UNSCHEDULABLE}"
    assert lines[3] == "    newest Event: Warning FailedScheduling: newer"
    assert lines[4].startswith("    next: kubectl gpuplane why pod/bronze-batch -n ex-mps;")
    assert lines[4].endswith("the example: manifests/examples/mps-tiers/")


def test_an_unsatisfiable_pod_that_runs_and_one_that_is_not_yet_scheduled_are_findings() -> None:
    findings = demo_verdict.judge({"unsatisfiable": [pod("u", "ran", "Running"), pod("u", "new", "Pending", "False")]})
    assert [(f.pod, f.actual, f.expected) for f in findings] == [
        ("u/new", "Pending (not yet scheduled)", "Pending (unschedulable)"),
        ("u/ran", "Running", "Pending (unschedulable)"),
    ]


def test_a_scheduled_pod_whose_containers_never_start_and_an_example_without_pods_are_findings() -> None:
    findings = demo_verdict.judge({"mig": [pod("m", "p", "Pending", "True")], "empty": []})
    assert [(f.example, f.pod, f.actual) for f in findings] == [
        ("empty", "", "no pod was created"),
        ("mig", "m/p", "Pending (scheduled, containers not started)"),
    ]
    assert findings[0].next_step.startswith("kubectl get all")


def test_examples_that_pin_a_gpu_go_after_gangs_and_before_those_that_take_any_gpu() -> None:
    folders = [f for f in demo.example_dirs() if f.name not in demo.TAKES_TURNS]
    order = [f.name for f in demo.apply_order(folders)]
    pinned = [f.name for f in folders if demo.pins_a_device(f)]
    assert "mps-tiers" in pinned
    gangs = [f.name for f in folders if demo.gangs_of(f)]
    assert order[: len(gangs)] == sorted(gangs)
    assert order[len(gangs) : len(gangs) + len(pinned)] == sorted(pinned)
    assert order.index("mps-tiers") < order.index("mig-two-profiles") < order.index("whole-gpu")
    assert not demo.pins_a_device(FIXTURES / "demo-broken-example")


def test_the_broken_example_fixture_is_judged_a_failure() -> None:
    folder = FIXTURES / "demo-broken-example"
    assert demo.namespaces_of(folder) == {"gpuplane-ex-broken"}
    waits = pod(
        "gpuplane-ex-broken", "waits", "Pending", "False", reason="Unschedulable", message="deviceclass not found"
    )
    shown = "tests/e2e/fixtures/demo-broken-example"
    findings = demo_verdict.judge({folder.name: [waits]}, folders={folder.name: shown})
    assert [f.pod for f in findings] == ["gpuplane-ex-broken/waits"]
    assert findings[0].next_step.endswith(f"the example: {shown}/")  # its own folder, not manifests/examples
