"""Gang status writes that cannot storm: merge patches of changed fields only, coalesced per gang.

A 256-member gang must not turn 256 pod updates into 256 status writes (the
field's worst incident: ~8 minutes of 409 conflicts on one status object). So:

* pod events never write status; the gang's reconcile computes the whole
  desired status and :func:`merge_patch` keeps only the fields that differ
  (a JSON merge patch carries no resourceVersion, so it never conflicts);
* :class:`Coalescer` lets a decision (a phase change) through at once and
  holds counter-only changes (members present, bound, running) to one write
  per ``min_interval_s`` per gang: O(1) writes per decision, whatever the size;
* the per-member placement is one compact string map written with the decision.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Fields whose change is a decision and is written immediately.
URGENT_FIELDS = ("phase", "placement", "reason", "nominatedVictims", "domain")


def condition(
    kind: str,
    status: bool,
    reason: str,
    message: str,
    *,
    previous: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """A condition; ``lastTransitionTime`` moves only when the status flips."""
    value = "True" if status else "False"
    since = (previous or {}).get("lastTransitionTime") if (previous or {}).get("status") == value else None
    return {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": since or now,
    }


def merge_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level fields of ``desired`` that differ from ``current`` (None values delete a field)."""
    out: dict[str, Any] = {}
    for key, value in desired.items():
        if value is None:
            if key in current:
                out[key] = None
        elif current.get(key) != value:
            out[key] = value
    return out


def is_urgent(patch: Mapping[str, Any]) -> bool:
    """Whether a patch carries a decision (not only counters and conditions' messages)."""
    return any(k in patch for k in URGENT_FIELDS)


@dataclass
class Coalescer:
    """Per-gang rate limit for non-urgent status patches (thread-safe; lives in the operator's memo)."""

    min_interval_s: float = 5.0
    _last: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, key: str, patch: Mapping[str, Any], now: float) -> bool:
        """True when ``patch`` should be written now (and records the write)."""
        if not patch:
            return False
        with self._lock:
            last = self._last.get(key)
            if not is_urgent(patch) and last is not None and now - last < self.min_interval_s:
                return False
            self._last[key] = now
            return True

    def reset(self) -> None:
        """Forget every record (a new leadership term: the previous leader's writes are unknown here)."""
        with self._lock:
            self._last.clear()

    def forget(self, key: str) -> None:
        """Drop a deleted gang's record."""
        with self._lock:
            self._last.pop(key, None)


def gang_conditions(
    previous: Sequence[Mapping[str, Any]], now: str, *, present: bool, placed: bool, scheduled: bool, msg: str
) -> list[dict[str, Any]]:
    """The gang's three conditions (MembersPresent, Placed, Scheduled), each keeping its transition time."""
    prev = {c.get("type"): c for c in previous}
    return [
        condition(
            "MembersPresent",
            present,
            "AllMembers" if present else "WaitingForMembers",
            "",
            previous=prev.get("MembersPresent"),
            now=now,
        ),
        condition(
            "Placed",
            placed,
            "Placed" if placed else "NotPlaced",
            "" if placed else msg,
            previous=prev.get("Placed"),
            now=now,
        ),
        condition(
            "Scheduled", scheduled, "AllBound" if scheduled else "NotBound", "", previous=prev.get("Scheduled"), now=now
        ),
    ]
