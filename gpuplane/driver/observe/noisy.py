"""Noisy-neighbour detection on MPS-shared GPUs: a pure detector with hysteresis.

Input per GPU and tick: the MPS claims on it (with their tiers) and each claim's share of the
GPU's memory bandwidth (0..1, attributed from per-process samples by :mod:`gpuplane.driver.observe.telemetry`).

Rule: claim H is a *hog* on GPU g when its share stays at or above ``threshold`` for
``sustain_s`` seconds while at least one co-located claim of a strictly higher tier (``tier_ranks``:
gold > silver > bronze) is present. The alert is *raised* once (the caller records an Event on
the hog's claim and on every higher-tier claim, and bumps a counter) and stays active until the
share falls below ``release`` (< ``threshold``: the hysteresis band keeps a share that hovers
around the threshold from flapping), the higher-tier claims leave, or H leaves; then it is
*cleared*. A dip below ``threshold`` before ``sustain_s`` has passed restarts the clock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_TIER_RANKS: Mapping[str, int] = {"gold": 3, "silver": 2, "bronze": 1}


@dataclass(frozen=True)
class NoisySettings:
    threshold: float = 0.5
    release: float = 0.4
    sustain_s: float = 30.0
    tier_ranks: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_TIER_RANKS))

    def __post_init__(self) -> None:
        if not 0.0 < self.release <= self.threshold <= 1.0:
            raise ValueError(f"need 0 < release ({self.release}) <= threshold ({self.threshold}) <= 1")

    def rank(self, tier: str) -> int:
        return self.tier_ranks.get(tier, 0)


@dataclass(frozen=True)
class Tenant:
    """An MPS claim on a GPU."""

    claim_uid: str
    namespace: str
    name: str
    tier: str


@dataclass(frozen=True)
class Alert:
    gpu: str
    hog: Tenant
    victims: tuple[Tenant, ...]
    share: float
    since: float  # when the share first stayed above the threshold


@dataclass(frozen=True)
class Transition:
    raised: bool  # True: raised; False: cleared
    alert: Alert


@dataclass
class _Track:
    above_since: float | None = None
    alert: Alert | None = None


class NoisyNeighbourDetector:
    """Keeps per-(GPU, claim) state between ticks; ``update`` returns what changed."""

    def __init__(self, settings: NoisySettings) -> None:
        self.settings = settings
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._lock = threading.RLock()  # active() is read from the driver's main loop (noisy taints)

    def active(self) -> list[Alert]:
        with self._lock:
            return [t.alert for t in self._tracks.values() if t.alert is not None]

    def update(self, gpu: str, tenants: Sequence[Tenant], shares: Mapping[str, float], now: float) -> list[Transition]:
        with self._lock:
            return self._update(gpu, tenants, shares, now)

    def _update(self, gpu: str, tenants: Sequence[Tenant], shares: Mapping[str, float], now: float) -> list[Transition]:
        s = self.settings
        out: list[Transition] = []
        present = {t.claim_uid for t in tenants}
        for key in [k for k in self._tracks if k[0] == gpu and k[1] not in present]:
            track = self._tracks.pop(key)
            if track.alert is not None:
                out.append(Transition(False, track.alert))
        for hog in tenants:
            share = float(shares.get(hog.claim_uid, 0.0))
            victims = tuple(
                sorted(
                    (t for t in tenants if s.rank(t.tier) > s.rank(hog.tier)),
                    key=lambda t: (-s.rank(t.tier), t.namespace, t.name),
                )
            )
            track = self._tracks.setdefault((gpu, hog.claim_uid), _Track())
            if track.alert is not None:
                if share < s.release or not victims:
                    out.append(Transition(False, track.alert))
                    track.alert = None
                    track.above_since = None
                else:
                    track.alert = Alert(gpu, hog, track.alert.victims, share, track.alert.since)
                continue
            if share >= s.threshold and victims:
                if track.above_since is None:
                    track.above_since = now
                if now - track.above_since >= s.sustain_s:
                    track.alert = Alert(gpu, hog, victims, share, track.above_since)
                    out.append(Transition(True, track.alert))
            else:
                track.above_since = None
        return out

    def forget_gpu(self, gpu: str, now: float) -> list[Transition]:
        """The GPU is gone or no longer MPS-shared: clear its alerts."""
        del now
        return self.update(gpu, (), {}, 0.0)
