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
  leader honours it too).

What is then done with the offender's pods (evicted through the Eviction API, or only reported
when bare) is :mod:`gpuplane.controller.rebalance.act`'s part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuplane.controller.rebalance.signal import DEFAULT_RANKS, Alert, Tenant, tenants

Kind = Literal["wait", "ignore", "cooldown", "evict"]


@dataclass(frozen=True)
class Settings:
    """The rebalancing knobs (controller flags)."""

    persist_s: float = 60.0
    cooldown_s: float = 300.0
    ranks: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_RANKS))


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
    claims: Iterable[Mapping[str, Any]],
    last_move: LastMove | None,
    now: float,
    s: Settings,
) -> Decision:
    """What to do about ``alert`` now."""
    on_gpu = tenants(claims, alert.pool, alert.device, s.ranks)
    hog = next((t for t in on_gpu if t.uid == alert.figures.hog_uid), None)
    persisted = max(0.0, now - alert.since)
    if hog is None:
        return Decision("ignore", alert, f"claim {alert.figures.hog_uid} is not allocated on {alert.gpu}")
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
    return out("evict", "persisted past the limit with a higher-tier neighbour")
