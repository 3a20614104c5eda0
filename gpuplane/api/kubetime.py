"""Times as the Kubernetes API writes them (RFC 3339, UTC), read and written in one place. Pure.

:func:`epoch` reads any field a user or another component may have written (a ``Time`` or ``MicroTime``):
absent, not a string or malformed reads as None, never an error; a time without a zone is taken as UTC.
:func:`rfc3339` writes a ``Time`` (seconds) or, with ``micro``, a ``MicroTime`` (the Lease's).
"""

from __future__ import annotations

import datetime
import time


def epoch(value: object) -> float | None:
    """Unix seconds of an RFC 3339 timestamp (``2026-12-07T08:00:00Z``, with or without a fraction)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def rfc3339(moment: float | None = None, *, micro: bool = False) -> str:
    """``moment`` (unix seconds; now when None) as the API writes a ``Time``, or a ``MicroTime`` with ``micro``."""
    when = datetime.datetime.fromtimestamp(time.time() if moment is None else moment, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")
