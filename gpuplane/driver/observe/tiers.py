"""Which tier a claim belongs to, for the telemetry labels, the noisy-neighbour roles and cost.

For MPS, the tier named by the claim's device class (``mps-<tier>.<domain>``, the convention of
manifests/deviceclasses, or ``class_tiers`` given explicitly); otherwise by how the device is
held (``whole``, ``mig``, ``timeslicing``; ``mps`` for an MPS class without a tier).
:class:`TierResolver` reads each MPS claim once from the API (a claim's spec is immutable) and
caches the answer; the rest is pure.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import structlog

from gpuplane.driver.observe import cost
from gpuplane.driver.prepare.checkpoint import ClaimRecord

log = structlog.get_logger(__name__)

_TIER_CLASS = re.compile(r"^mps-([a-z0-9-]+)\.")


class ClaimReader(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...


def class_names(claim: Mapping[str, Any]) -> list[str]:
    """Device class names a ResourceClaim's requests name (``exactly`` and ``firstAvailable``)."""
    out: list[str] = []
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = req.get("exactly") or {}
        if exactly.get("deviceClassName"):
            out.append(str(exactly["deviceClassName"]))
        out.extend(str(sub["deviceClassName"]) for sub in req.get("firstAvailable") or [] if sub.get("deviceClassName"))
    return out


def tier_from_classes(names: Iterable[str], class_tiers: Mapping[str, str]) -> str | None:
    for name in names:
        if name in class_tiers:
            return class_tiers[name]
        m = _TIER_CLASS.match(name)
        if m:
            return m.group(1)
    return None


class TierResolver:
    """Claim record -> tier; reads each MPS claim once from the API (claims' specs are immutable)."""

    def __init__(self, claims: ClaimReader | None, class_tiers: Mapping[str, str] | None = None) -> None:
        self.claims = claims
        self.class_tiers = dict(class_tiers or {})
        self._cache: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, rec: ClaimRecord) -> str:
        base = cost.default_tier(rec)
        if base != cost.TIER_MPS or self.claims is None:
            return base
        with self._lock:
            if rec.uid in self._cache:
                return self._cache[rec.uid]
        try:
            obj = self.claims.get_claim(rec.namespace, rec.name)
        except Exception as exc:  # not cached: retried on the next tick
            log.debug("tier lookup failed", claim=f"{rec.namespace}/{rec.name}", error=str(exc))
            return base
        if (obj.get("metadata") or {}).get("uid") != rec.uid:
            return base
        tier = tier_from_classes(class_names(obj), self.class_tiers) or base
        with self._lock:
            self._cache[rec.uid] = tier
        return tier

    def forget(self, keep: Iterable[str]) -> None:
        keep_set = set(keep)
        with self._lock:
            for uid in [u for u in self._cache if u not in keep_set]:
                del self._cache[uid]
