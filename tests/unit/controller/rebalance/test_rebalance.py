"""Noisy-neighbour rebalancing: the rule (decide), the pass (act) against a recording writer, the ledger.

The ResourceSlice and ResourceClaim bodies have the shape the API server returns (allocation
results with pool/device/shareID/consumedCapacity, reservedFor, device taints with timeAdded);
the writer records every call in order, so the tests check what is written and when: the
DeviceTaintRule before the eviction, nothing evicted for a bare pod or without the rule API, a
refusal reported once per alert and retried after the cool-down.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuplane.api import noisy_taint
from gpuplane.controller import indexed
from gpuplane.controller.metrics import ControllerMetrics
from gpuplane.controller.rebalance import act, moves, signal
from gpuplane.controller.rebalance.decide import LastMove, Settings, decide
from gpuplane.driver.observe.cost import read_ledger

HOG = "0b9c3f52-6a1e-4c7d-9e8f-1a2b3c4d5e6f"
GOLD = "1c8d4a63-7b2f-4d8e-8f90-2b3c4d5e6f70"
T0 = 1_800_000_000.0


def ts(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def slice_with_taint(value: str, since: float = T0, device: str = "gpu-3") -> dict[str, Any]:
    taint = {"key": noisy_taint.KEY, "value": value, "effect": "None", "timeAdded": ts(since)}
    return {
        "spec": {
            "driver": "gpu.gpuplane.dev",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": device, "taints": [taint]}, {"name": "gpu-4"}],
        }
    }


def claim(uid: str, name: str, tier: str, share: int, pods: list[str], *, device: str = "gpu-3") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": name, "namespace": "team", "annotations": {}},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": f"mps-{tier}.gpu.gpuplane.dev"}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.gpuplane.dev",
                            "pool": "node-a",
                            "device": device,
                            "shareID": "abc",
                            "consumedCapacity": {"sharePercent": str(share)},
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods],
        },
    }


def index(claims: Sequence[Mapping[str, Any]]) -> list[indexed.ClaimView]:
    """The claims as the claim index holds them (through the informer's transform): what a pass reads."""
    return [indexed.claim(c) for c in claims]


FIG = noisy_taint.encode(noisy_taint.NoisyFigures(HOG, 80, 50, 3))


class Writer:
    """Records calls; answers reads from what the test set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.rules: dict[str, dict[str, Any]] | None = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.refuse: str | None = None

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get(name)

    def list_pods(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.pods.values())

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> str | None:
        self.calls.append(("evict", name))
        if self.refuse is None:
            self.pods.pop(name, None)
        return self.refuse

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        return {"team": {"gpuplane.dev/max-tier": "gold"}}  # granted gold by its administrator

    def list_device_taint_rules(self, label: str) -> list[dict[str, Any]] | None:
        return None if self.rules is None else list(self.rules.values())

    def create_device_taint_rule(self, body: Mapping[str, Any]) -> None:
        self.calls.append(("create-rule", body["metadata"]["name"]))
        assert self.rules is not None
        self.rules[body["metadata"]["name"]] = json.loads(json.dumps(body))

    def delete_device_taint_rule(self, name: str) -> None:
        self.calls.append(("delete-rule", name))
        if self.rules is not None:
            self.rules.pop(name, None)

    def annotate_device_taint_rule(self, name: str, annotations: Mapping[str, str]) -> None:
        self.calls.append(("annotate-rule", name))
        assert self.rules is not None
        self.rules[name]["metadata"]["annotations"].update(annotations)

    def annotate_claim(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.calls.append(("annotate-claim", (name, dict(annotations))))

    def event(self, ref: Any, kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", (ref.kind, ref.name, kind, reason, message)))

    def events(self, reason: str) -> list[tuple[str, str, str, str, str]]:
        return [c[1] for c in self.calls if c[0] == "event" and c[1][3] == reason]


def owned_pod(name: str, owner: str = "ReplicaSet") -> dict[str, Any]:
    refs = [{"kind": owner, "name": "bronze-7f", "uid": "rs-1", "controller": True}] if owner else []
    return {"metadata": {"name": name, "uid": f"uid-{name}", "ownerReferences": refs}, "status": {"phase": "Running"}}


def world() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return [slice_with_taint(FIG)], [
        claim(HOG, "bronze-claim", "bronze", 20, ["bronze-1"]),
        claim(GOLD, "gold", "gold", 60, ["gold-0"]),
    ]


S = Settings(persist_s=10.0, cooldown_s=100.0)
TEAM = {"team": {"gpuplane.dev/max-tier": "gold"}}  # the namespace's labels: granted gold by its administrator


def run(r: act.Rebalancer, slices: list[dict[str, Any]], claims: list[dict[str, Any]], now: float) -> list[str]:
    return [o for _, o in asyncio.run(r.run_pass(slices, index(claims), now))]


# --- the rule --------------------------------------------------------------------------------


def test_decide_follows_the_rule() -> None:
    slices, claims = world()
    (alert,) = signal.alerts(slices)
    assert (alert.pool, alert.device, alert.figures.share_pct, alert.since) == ("node-a", "gpu-3", 80, T0)
    assert decide(alert, index(claims), None, T0 + 5, S, namespaces=TEAM).kind == "wait"
    d = decide(alert, index(claims), None, T0 + 11, S, namespaces=TEAM)
    assert d.kind == "evict" and d.hog is not None and d.hog.tier == "bronze"
    assert [v.tier for v in d.victims] == ["gold"]
    assert "80% of the memory bandwidth of node-a/gpu-3 (threshold 50%" in d.figures()
    # One move per GPU per cool-down: another hog within it waits; the same one is under way.
    assert decide(alert, index(claims), LastMove("someone-else", T0), T0 + 50, S, namespaces=TEAM).kind == "cooldown"
    assert decide(alert, index(claims), LastMove(HOG, T0), T0 + 50, S, namespaces=TEAM).kind == "ignore"
    assert decide(alert, index(claims), LastMove("someone-else", T0), T0 + 101, S, namespaces=TEAM).kind == "evict"


def test_never_a_higher_or_equal_tier_for_a_lower_one() -> None:
    slices, _ = world()
    (alert,) = signal.alerts(slices)
    gold_hog = [claim(HOG, "gold-hog", "gold", 60, ["g"]), claim(GOLD, "bronze", "bronze", 20, ["b"])]
    d = decide(alert, index(gold_hog), None, T0 + 999, S, namespaces=TEAM)
    assert d.kind == "ignore" and "no claim of a higher tier than gold" in d.why
    peers = [claim(HOG, "a", "silver", 40, ["a"]), claim(GOLD, "b", "silver", 40, ["b"])]
    assert decide(alert, index(peers), None, T0 + 999, S, namespaces=TEAM).kind == "ignore"


def test_a_node_cannot_name_a_claim_elsewhere() -> None:
    slices, claims = world()
    claims[0] = claim(HOG, "bronze-claim", "bronze", 20, ["bronze-1"], device="gpu-4")  # not on gpu-3
    (alert,) = signal.alerts(slices)
    d = decide(alert, index(claims), None, T0 + 999, S, namespaces=TEAM)
    assert d.kind == "ignore" and "is not allocated on node-a/gpu-3" in d.why


@pytest.mark.parametrize("value", ["nonsense", f"{HOG}_180_50_3", f"{HOG}_80_50", "x" * 80, 7, None])
def test_malformed_taints_are_ignored(value: Any) -> None:
    s = slice_with_taint("placeholder")
    s["spec"]["devices"][0]["taints"][0]["value"] = value
    assert signal.alerts([s]) == []


# --- the pass --------------------------------------------------------------------------------


def test_evicts_through_the_eviction_api_after_the_rule_exists(tmp_path: Path) -> None:
    w = Writer()
    w.pods["bronze-1"] = owned_pod("bronze-1")
    r = act.Rebalancer(w, S, ControllerMetrics(), tmp_path / "moves.jsonl")
    slices, claims = world()
    assert run(r, slices, claims, T0 + 11) == ["evicted"]
    order = [c[0] for c in w.calls if c[0] in ("create-rule", "evict")]
    assert order == ["create-rule", "evict"]
    rule = next(iter(w.rules.values()))  # type: ignore[union-attr]
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.gpuplane.dev", "pool": "node-a", "device": "gpu-3"}
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    (pod_ev, claim_ev) = w.events(act.EVICTED)
    assert (pod_ev[0], pod_ev[1], pod_ev[2]) == ("Pod", "bronze-1", "Warning") and claim_ev[0] == "ResourceClaim"
    assert "kept off node-a/gpu-3" in pod_ev[4] and "gold" in pod_ev[4]
    assert {(e[0], e[1]) for e in w.events(act.MOVED)} == {("ResourceClaim", "gold"), ("Pod", "gold-0")}
    # While the hog is still listed (its pod terminating), nothing more happens.
    w.calls.clear()
    assert run(r, slices, claims, T0 + 12) == ["ignore"]
    assert not [c for c in w.calls if c[0] in ("evict", "event")]


def test_replacement_running_is_charged_to_the_ledger_and_the_rule_expires(tmp_path: Path) -> None:
    w = Writer()
    w.pods["bronze-1"] = owned_pod("bronze-1")
    ledger = tmp_path / "moves.jsonl"
    r = act.Rebalancer(w, S, ControllerMetrics(), ledger)
    slices, claims = world()
    run(r, slices, claims, T0 + 11)
    new = owned_pod("bronze-2")
    new["metadata"]["creationTimestamp"] = ts(T0 + 12)
    new["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": ts(T0 + 31)}]
    w.pods["bronze-2"] = new
    run(r, [], [], T0 + 35)
    (seg,) = list(read_ledger([ledger]))
    assert (seg.kind, seg.name, seg.namespace, seg.tier, seg.device) == ("moved", "bronze-1", "team", "bronze", "gpu-3")
    # Ready "at T0+31" (whole seconds) is some instant of [31, 32), seen at 35: charged to 32.
    assert seg.fraction == 0.2 and seg.end - seg.start == 21.0 and abs(seg.gpu_seconds - 4.2) < 1e-9
    (ev,) = w.events(act.REPLACED)
    assert ev[1] == "bronze-2" and "4.2 GPU-seconds" in ev[4] and "for 21.0s" in ev[4]
    run(r, [], [], T0 + 40)
    assert len(list(read_ledger([ledger]))) == 1  # charged once
    run(r, [], [], T0 + 11 + 100)
    assert w.rules == {}  # cool-down over: the rule is gone


def _charged(tmp_path: Path, evicted_at: float, seen: float, status: dict[str, Any]) -> tuple[float, float, float]:
    """(start, end, gpu_seconds) of the ledger line when the replacement, with this status, is seen at ``seen``."""
    w = Writer()
    w.pods["bronze-1"] = owned_pod("bronze-1")
    ledger = tmp_path / "moves.jsonl"
    r = act.Rebalancer(w, S, ControllerMetrics(), ledger)
    slices, claims = world()
    assert run(r, slices, claims, evicted_at) == ["evicted"]
    new = owned_pod("bronze-2")
    new["metadata"]["creationTimestamp"] = ts(evicted_at)
    new["status"].update(status)
    w.pods["bronze-2"] = new
    run(r, [], [], seen)
    (seg,) = list(read_ledger([ledger]))
    return seg.start, seg.end, seg.gpu_seconds


def test_a_replacement_ready_in_the_evictions_second_is_charged_more_than_nothing(tmp_path: Path) -> None:
    """Issue 15 audit D2: Ready is recorded to the second; evicted at :11.98 and Ready at :11.99 (recorded
    ":11") was charged max(11.98, 11) - 11.98 = 0 GPU-seconds, and the e2e's gpu_seconds > 0 flaked."""
    ready = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ts(T0 + 11)}]}
    start, end, gpu_seconds = _charged(tmp_path, T0 + 11.98, T0 + 17, ready)
    assert start == T0 + 11.98 and abs(end - (T0 + 12)) < 1e-6, (start, end)  # the recorded second's end
    assert gpu_seconds > 0 and abs(gpu_seconds - 0.2 * 0.02) < 1e-6, gpu_seconds


def test_the_charge_ends_at_the_ready_time_not_when_a_late_pass_sees_it(tmp_path: Path) -> None:
    # A leader that restarts (or a slow pass) sees the replacement long after: still charged to Ready + 1 s.
    ready = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ts(T0 + 20)}]}
    assert _charged(tmp_path / "late", T0 + 11, T0 + 90, ready)[1] == T0 + 21
    # Seen within the recorded second: the controller's own time, not a second that has not ended yet.
    assert _charged(tmp_path / "soon", T0 + 11, T0 + 20.4, ready)[1] == T0 + 20.4
    # No Ready condition: the start time, read the same way.
    assert _charged(tmp_path / "start", T0 + 11, T0 + 30, {"startTime": ts(T0 + 14)})[1] == T0 + 15
    # No time at all, or one whose second ended before the eviction (skew, a stale condition): when it was seen.
    assert _charged(tmp_path / "none", T0 + 11, T0 + 16.5, {})[1] == T0 + 16.5
    stale = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ts(T0 + 3)}]}
    assert _charged(tmp_path / "stale", T0 + 11, T0 + 16.5, stale)[1] == T0 + 16.5


def test_pdb_refusal_is_reported_once_and_tried_again_after_the_cooldown() -> None:
    w = Writer()
    w.pods["bronze-1"] = owned_pod("bronze-1")
    w.refuse = (
        "Cannot evict pod as it would violate the pod's disruption budget. "
        "(The disruption budget bronze needs 1 healthy pods and has 1 currently)"
    )
    r = act.Rebalancer(w, S, ControllerMetrics())
    slices, claims = world()
    assert run(r, slices, claims, T0 + 11) == ["refused"]
    assert [c[0] for c in w.calls if c[0] in ("create-rule", "evict", "delete-rule")] == [
        "delete-rule",
        "create-rule",
        "evict",
        "delete-rule",
    ]
    assert w.rules == {}
    not_moved = w.events(act.NOT_MOVED)
    assert {(e[0], e[1]) for e in not_moved} >= {
        ("Pod", "bronze-1"),
        ("ResourceClaim", "bronze-claim"),
        ("ResourceClaim", "gold"),
    }
    assert "disruption budget bronze needs 1 healthy pods" in not_moved[0][4]
    (ann,) = [c[1] for c in w.calls if c[0] == "annotate-claim"]
    claims[0]["metadata"]["annotations"].update(ann[1])  # what the API now shows
    w.calls.clear()
    assert run(r, slices, claims, T0 + 50) == ["refused"]
    assert w.calls == []  # reported once per alert, not every pass
    run(r, slices, claims, T0 + 11 + 101)
    assert ("evict", "bronze-1") in w.calls  # tried again after the cool-down


def test_bare_pod_is_reported_not_evicted() -> None:
    w = Writer()
    w.pods["bronze-1"] = owned_pod("bronze-1", owner="")
    r = act.Rebalancer(w, S, ControllerMetrics())
    slices, claims = world()
    assert run(r, slices, claims, T0 + 11) == ["bare-pod"]
    assert not [c for c in w.calls if c[0] in ("evict", "create-rule")]
    assert "no controller" in w.events(act.NOT_MOVED)[0][4]


def test_without_the_device_taint_rule_api_nothing_is_moved() -> None:
    w = Writer()
    w.rules = None
    w.pods["bronze-1"] = owned_pod("bronze-1")
    r = act.Rebalancer(w, S, ControllerMetrics())
    slices, claims = world()
    assert run(r, slices, claims, T0 + 11) == ["no-taint-rules"]
    assert not [c for c in w.calls if c[0] == "evict"]
    assert "DRADeviceTaintRules" in w.events(act.NOT_MOVED)[0][4]


def test_a_claim_shared_by_two_pods_is_not_moved() -> None:
    w = Writer()
    r = act.Rebalancer(w, S, ControllerMetrics())
    slices, claims = world()
    claims[0] = claim(HOG, "bronze-claim", "bronze", 20, ["a", "b"])
    assert run(r, slices, claims, T0 + 11) == ["shared-claim"]
    assert not [c for c in w.calls if c[0] == "evict"]


def test_move_record_round_trips_and_rule_names_fit() -> None:
    m = moves.Move("p", "n", "gpu-1", HOG, "ns", "c", "pod", "bronze", "ReplicaSet/x", "u", 0.2, T0, "f", "v")
    assert moves.Move.from_json(m.to_json()) == m
    assert moves.Move.from_json("{broken") is None
    long = moves.rule_name("n" * 250, "gpu-1")
    assert len(long) <= 253 and long.startswith("gpuplane-moved.")


def test_what_a_move_reads_of_a_pod_is_parsed_once_and_total_on_any_body() -> None:
    body = {
        "metadata": {
            "name": "p-2",
            "uid": "u-2",
            "creationTimestamp": "2026-12-07T08:00:00Z",
            "ownerReferences": [
                {"kind": "Node", "name": "n", "uid": "x"},
                {"kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True},
            ],
        },
        "status": {
            "phase": "Running",
            "startTime": "2026-12-07T08:00:01Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-07T08:00:05Z"}],
        },
    }
    got = moves.pod_facts(body)
    assert (got.name, got.uid, got.owner, got.running) == ("p-2", "u-2", ("ReplicaSet", "rs", "rs-1"), True)
    assert got.ready_since is not None and got.ready_since - got.created == 5.0
    not_ready = {**body, "status": {"phase": "Pending", "startTime": "2026-12-07T08:00:01Z"}}
    assert moves.pod_facts(not_ready).ready_since == got.created + 1 and not moves.pod_facts(not_ready).running
    for odd in ({}, {"metadata": [], "status": "x"}, {"metadata": {"ownerReferences": {"controller": True}}}):
        facts = moves.pod_facts(odd)
        assert (facts.name, facts.uid, facts.owner, facts.created, facts.ready_since) == ("", "", None, 0.0, None)
