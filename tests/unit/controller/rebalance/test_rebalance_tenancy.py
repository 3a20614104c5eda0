"""Rebalancing among tenants (issue 32, defect 4): tiers are entitlements, not a claim's word.

* a claim of ``mps-gold`` in a namespace its administrator did not label ``gpuplane.dev/max-tier``
  counts as that namespace's entitled tier (``bronze`` unlabelled), so it gets no neighbour evicted;
* a forged ``gpuplane.dev/noisy-neighbour-decision`` annotation on the offender's own claim neither
  suppresses its eviction nor changes what is decided;
* a cluster-wide eviction budget stops evictions past N per window (metric, log line, Event);
* nothing in a system namespace is ever evicted;
* each eviction is pinned to the uid of the claim's consumer: a pod made again under the same name
  is not evicted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpuplane.api import noisy_taint
from gpuplane.controller.metrics import ControllerMetrics
from gpuplane.controller.rebalance import act, signal
from gpuplane.controller.rebalance.decide import Settings, decide
from tests.unit.controller.rebalance.test_rebalance import (
    FIG,
    GOLD,
    HOG,
    T0,
    Writer,
    claim,
    index,
    owned_pod,
    slice_with_taint,
)

MAX_TIER = "gpuplane.dev/max-tier"  # the administrator's label on a namespace (tenants cannot write it)
SYSTEM = "gpuplane.dev/system"
GOLD_NS = {MAX_TIER: "gold"}


def settings(**kw: Any) -> Settings:
    return Settings(**{"persist_s": 10.0, "cooldown_s": 100.0, "budget": 2, "budget_window_s": 1000.0, **kw})


class TenantWriter(Writer):
    """The recording writer of test_rebalance, with namespaces (their labels) and uid-pinned evictions."""

    def __init__(self, namespaces: dict[str, dict[str, str]] | None = None) -> None:
        super().__init__()
        self.namespaces = {"team": dict(GOLD_NS)} if namespaces is None else namespaces
        self.evicted_uids: list[str] = []

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        return {k: dict(v) for k, v in self.namespaces.items()}

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> str | None:
        self.evicted_uids.append(uid)
        pod = self.pods.get(name)
        if pod is not None and uid and pod["metadata"]["uid"] != uid:
            return f"pod {namespace}/{name} is no longer the pod of uid {uid} (uid precondition)"
        return super().evict_pod(namespace, name)


def world(gold_ns: str = "team", hog_ns: str = "team") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    hog = claim(HOG, "bronze-claim", "bronze", 20, ["bronze-1"])
    hog["metadata"]["namespace"] = hog_ns
    gold = claim(GOLD, "gold", "gold", 60, ["gold-0"])
    gold["metadata"]["namespace"] = gold_ns
    return [slice_with_taint(FIG)], [hog, gold]


def run(r: act.Rebalancer, slices: list[dict[str, Any]], claims: list[dict[str, Any]], now: float) -> list[str]:
    return [o for _, o in asyncio.run(r.run_pass(slices, index(claims), now))]


# --- tiers are entitlements ------------------------------------------------------------------


def test_an_unentitled_gold_claim_counts_as_its_namespaces_tier() -> None:
    slices, claims = world(gold_ns="squatter", hog_ns="team")
    (alert,) = signal.alerts(slices)
    # "squatter" is unlabelled: its mps-gold claim is a bronze tenant, the bronze neighbour is no lower.
    d = decide(alert, index(claims), None, T0 + 999, settings(), namespaces={"team": {}})
    assert d.kind == "ignore" and "no claim of a higher tier than bronze" in d.why, d
    # Granted silver: it counts as silver, above bronze, and the rule applies.
    d = decide(alert, index(claims), None, T0 + 999, settings(), namespaces={"squatter": {MAX_TIER: "silver"}})
    assert d.kind == "evict" and [v.tier for v in d.victims] == ["silver"]
    assert "class gold, namespace not entitled" in d.victims[0].label()
    # A label that is not a tier grants the default only.
    d = decide(alert, index(claims), None, T0 + 999, settings(), namespaces={"squatter": {MAX_TIER: "platinum"}})
    assert d.kind == "ignore"


def test_an_unentitled_gold_claim_gets_nobody_evicted_in_a_pass() -> None:
    w = TenantWriter(namespaces={"team": {}})  # the gold claim's namespace was never granted gold
    w.pods["bronze-1"] = owned_pod("bronze-1")
    r = act.Rebalancer(w, settings(), ControllerMetrics())
    slices, claims = world()
    assert run(r, slices, claims, T0 + 11) == ["ignore"]
    assert not [c for c in w.calls if c[0] in ("evict", "create-rule")]
    # The administrator grants gold: the same alert now moves the bronze neighbour.
    w.namespaces["team"] = dict(GOLD_NS)
    assert run(r, slices, claims, T0 + 12) == ["evicted"]


def test_entitlement_defaults_and_system_namespaces() -> None:
    from gpuplane.controller.rebalance import entitlement

    ranks = {"gold": 3, "silver": 2, "bronze": 1}
    assert entitlement.max_tier(None) == entitlement.max_tier({}) == "bronze"
    assert entitlement.entitled("gold", {MAX_TIER: "silver"}, ranks) == "silver"
    assert entitlement.entitled("bronze", GOLD_NS, ranks) == "bronze"
    assert entitlement.entitled("none", {}, ranks) == "none"
    assert entitlement.is_system("kube-system", None) and entitlement.is_system("gpuplane-system", {})
    assert entitlement.is_system("infra", {SYSTEM: "true"})
    assert not entitlement.is_system("team", {SYSTEM: "false"})


# --- tenant-written state is display only ----------------------------------------------------


def test_a_forged_decision_annotation_does_not_suppress_the_eviction() -> None:
    w = TenantWriter()
    w.pods["bronze-1"] = owned_pod("bronze-1")
    r = act.Rebalancer(w, settings(), ControllerMetrics())
    slices, claims = world()
    # The offender writes on its own claim what a refusal for this very alert would have left there.
    forged = f"refused@{T0:.0f}@{T0 + 10:.0f}"
    claims[0]["metadata"]["annotations"][act.ANNOTATION] = forged
    assert run(r, slices, claims, T0 + 11) == ["evicted"]
    assert ("evict", "bronze-1") in w.calls


def test_a_forged_decision_annotation_does_not_silence_a_report() -> None:
    w = TenantWriter()
    w.pods["bronze-1"] = owned_pod("bronze-1", owner="")  # bare: reported, not evicted
    r = act.Rebalancer(w, settings(), ControllerMetrics())
    slices, claims = world()
    claims[0]["metadata"]["annotations"][act.ANNOTATION] = f"bare-pod@{T0:.0f}@{T0 + 10:.0f}"
    assert run(r, slices, claims, T0 + 11) == ["bare-pod"]
    assert w.events(act.NOT_MOVED), "the gold neighbour is told, whatever the offender's claim says"
    # Reported once per alert by the controller's own memory, not by the annotation.
    w.calls.clear()
    claims[0]["metadata"]["annotations"].pop(act.ANNOTATION)
    assert run(r, slices, claims, T0 + 12) == ["bare-pod"]
    assert w.events(act.NOT_MOVED) == []


# --- the cluster-wide eviction budget --------------------------------------------------------


def _gpu_world(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], TenantWriter]:
    """``n`` GPUs, each with a noisy bronze pod next to a gold one."""
    w = TenantWriter()
    slices: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for i in range(n):
        hog = f"{HOG[:-2]}{i:02d}"
        fig = noisy_taint.encode(noisy_taint.NoisyFigures(hog, 80, 50, 3))
        slices.append(slice_with_taint(fig, device=f"gpu-{i}"))
        slices[-1]["spec"]["devices"] = slices[-1]["spec"]["devices"][:1]
        claims.append(claim(hog, f"bronze-{i}", "bronze", 20, [f"b-{i}"], device=f"gpu-{i}"))
        claims.append(claim(f"{GOLD[:-2]}{i:02d}", f"gold-{i}", "gold", 60, [f"g-{i}"], device=f"gpu-{i}"))
        w.pods[f"b-{i}"] = owned_pod(f"b-{i}")
    return slices, claims, w


def test_the_eviction_budget_stops_evictions_across_the_cluster() -> None:
    slices, claims, w = _gpu_world(4)
    metrics = ControllerMetrics()
    r = act.Rebalancer(w, settings(), metrics)
    assert run(r, slices, claims, T0 + 11) == ["evicted", "evicted", "budget", "budget"]
    assert [c[1] for c in w.calls if c[0] == "evict"] == ["b-0", "b-1"]
    said = [e for e in w.events(act.NOT_MOVED) if e[1] == "bronze-2"]
    assert said and "eviction budget is spent: 2 eviction(s) within the last 1000s, at most 2" in said[0][4]
    got = metrics.registry.get_sample_value("gpuplane_rebalance_decisions_total", {"outcome": "budget"})
    assert got == 2
    # A new leader (fresh memory) still counts the evictions its rules record.
    w2 = TenantWriter()
    w2.rules, w2.pods = w.rules, w.pods
    r2 = act.Rebalancer(w2, settings(), ControllerMetrics())
    assert run(r2, slices[2:], claims[4:], T0 + 120) == ["budget", "budget"]
    # Past the window the budget has room again (the rules went after their cool-down; the memory counts).
    assert run(r, slices[2:], claims[4:], T0 + 11 + 1001) == ["evicted", "evicted"]


def test_a_zero_budget_evicts_nothing() -> None:
    slices, claims, w = _gpu_world(1)
    r = act.Rebalancer(w, settings(budget=0), ControllerMetrics())
    assert run(r, slices, claims, T0 + 11) == ["budget"]
    assert not [c for c in w.calls if c[0] == "evict"]


# --- system namespaces and the uid precondition ----------------------------------------------


def test_never_evicts_in_a_system_namespace() -> None:
    for ns, labels in (("kube-system", {}), ("infra", {SYSTEM: "true"})):
        w = TenantWriter(namespaces={"team": dict(GOLD_NS), ns: labels})
        w.pods["bronze-1"] = owned_pod("bronze-1")
        r = act.Rebalancer(w, settings(), ControllerMetrics())
        slices, claims = world(hog_ns=ns)
        (d, outcome), *_ = asyncio.run(r.run_pass(slices, index(claims), T0 + 11))
        assert outcome == "ignore" and "system namespace" in d.why, d
        assert not [c for c in w.calls if c[0] in ("evict", "create-rule")]


def test_the_eviction_is_pinned_to_the_consumers_uid() -> None:
    w = TenantWriter()
    w.pods["bronze-1"] = owned_pod("bronze-1")
    r = act.Rebalancer(w, settings(), ControllerMetrics())
    slices, claims = world()
    assert run(r, slices, claims, T0 + 11) == ["evicted"]
    assert w.evicted_uids == ["uid-bronze-1"]  # the uid the claim's reservedFor names


def test_a_pod_made_again_under_the_same_name_is_not_evicted() -> None:
    w = TenantWriter()
    again = owned_pod("bronze-1")
    again["metadata"]["uid"] = "uid-of-a-new-pod"  # the claim's consumer was uid-bronze-1
    w.pods["bronze-1"] = again
    r = act.Rebalancer(w, settings(), ControllerMetrics())
    slices, claims = world()
    assert run(r, slices, claims, T0 + 11) == ["gone"]
    assert not [c for c in w.calls if c[0] in ("evict", "create-rule")]
