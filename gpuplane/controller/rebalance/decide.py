"""Whether to move a noisy neighbour now: the rule, on one alert. Pure.

The offender (the alert's hog claim) is moved only when all of these hold:

* the claim the driver names is allocated on that very GPU (a node cannot get a claim elsewhere
  evicted by naming it);
* a claim of a strictly higher tier shares the GPU (gold > silver > bronze > untiered): a pod is
  never moved for a neighbour of its own or a lower tier, so a gold pod is never moved for a bronze
  one;
* the alert has persisted at least ``persist_s`` since the driver raised it (the driver already
  waited its own ``sustain`` above the threshold before raising it);
* no neighbour was moved off this GPU within the last ``cooldown_s``: at most one eviction per GPU
  per cool-down (the record is the DeviceTaintRule of that move, in the API, so a restarted or new
  leader honours it too);
* the offender is not in a system namespace (:mod:`~gpuplane.controller.rebalance.entitlement`);
* the cluster-wide eviction budget has room: fewer than ``budget`` evictions (anywhere) within the
  last ``budget_window_s``.

Tiers are entitlements, not a claim's word: each claim counts at most as the tier its namespace's
administrator-set label ``gpuplane.dev/max-tier`` allows (``bronze`` when unlabelled), so a claim
of ``mps-gold`` in a namespace granted bronze is a bronze tenant here, whether or not the admission
policy saw it. Nothing a tenant writes on its own objects (annotations) enters a decision.

What is then done with the offender's pods (evicted through the Eviction API, or only reported
when bare) is :mod:`gpuplane.controller.rebalance.act`'s part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuplane.controller import indexed
from gpuplane.controller.rebalance.entitlement import Labels
from gpuplane.controller.rebalance.signal import DEFAULT_RANKS, Alert, Tenant, tenants

Kind = Literal["wait", "ignore", "cooldown", "budget", "evict"]


@dataclass(frozen=True)
class Settings:
    """The rebalancing knobs (controller flags)."""

    persist_s: float = 60.0
    cooldown_s: float = 300.0
    ranks: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_RANKS))
    budget: int = 5  # evictions across the cluster per window (0: never evict, only report)
    budget_window_s: float = 600.0


@dataclass(frozen=True)
class LastMove:
    """The most recent move off a GPU (from its DeviceTaintRule)."""

    hog_uid: str
    at: float


@dataclass(frozen=True)
class Decision:
    """The outcome for one alert, with the figures that led to it."""

    kind: Kind
    alert: Alert
    why: str
    hog: Tenant | None = None
    victims: tuple[Tenant, ...] = ()
    persisted_s: float = 0.0

    def figures(self) -> str:
        """The figures, as the Events and the log line quote them."""
        f = self.alert.figures
        return (
            f"{f.share_pct}% of the memory bandwidth of {self.alert.gpu} (threshold {f.threshold_pct}%, "
            f"alert raised after {f.sustain_s}s above it and standing for {self.persisted_s:.0f}s)"
        )


def decide(
    alert: Alert,
    claims: Iterable[indexed.ClaimView],
    last_move: LastMove | None,
    now: float,
    s: Settings,
    *,
    namespaces: Mapping[str, Labels] | None = None,
    evictions: Iterable[float] = (),
) -> Decision:
    """What to do about ``alert`` now.

    ``namespaces``: each namespace's labels (absent: unlabelled, so bronze at most); ``evictions``: when
    each recent eviction of the cluster happened (for the budget).
    """
    on_gpu = tenants(claims, alert.pool, alert.device, s.ranks, namespaces or {})
    hog = next((t for t in on_gpu if t.uid == alert.figures.hog_uid), None)
    persisted = max(0.0, now - alert.since)
    if hog is None:
        return Decision("ignore", alert, f"claim {alert.figures.hog_uid} is not allocated on {alert.gpu}")
    if hog.system:
        return Decision("ignore", alert, f"{hog.namespace} is a system namespace: gpuplane never evicts there", hog)
    victims = tuple(t for t in on_gpu if t.rank > hog.rank)
    if not victims:
        return Decision("ignore", alert, f"no claim of a higher tier than {hog.tier} shares {alert.gpu}", hog)

    def out(kind: Kind, why: str) -> Decision:
        return Decision(kind, alert, why, hog, victims, persisted)

    if persisted < s.persist_s:
        return out("wait", f"alert standing for {persisted:.0f}s of {s.persist_s:.0f}s")
    if last_move is not None and now - last_move.at < s.cooldown_s:
        if last_move.hog_uid == hog.uid:
            return out("ignore", "its move is under way")
        until = last_move.at + s.cooldown_s
        return out(
            "cooldown",
            f"a neighbour was moved off {alert.gpu} {now - last_move.at:.0f}s ago; at most one move per GPU "
            f"every {s.cooldown_s:.0f}s, the next in {until - now:.0f}s",
        )
    recent = sorted(t for t in evictions if now - t < s.budget_window_s)
    if len(recent) >= s.budget:
        nxt = f"; the next in {recent[len(recent) - s.budget] + s.budget_window_s - now:.0f}s" if s.budget else ""
        return out(
            "budget",
            f"the cluster-wide eviction budget is spent: {len(recent)} eviction(s) within the last "
            f"{s.budget_window_s:.0f}s, at most {s.budget}{nxt}",
        )
    return out("evict", "persisted past the limit with a higher-tier neighbour")
