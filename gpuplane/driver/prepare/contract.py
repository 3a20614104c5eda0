"""What the kubelet-facing gRPC layer and the prepare core agree on: plain claim values and ``ClaimPreparer``.

Nothing here knows about protobuf or gRPC: the servicers translate between
these dataclasses and the wire messages, so the prepare/unprepare state can be
written and tested without either. The core owns these types; the gRPC layer
(:mod:`gpuplane.driver.plugin`) imports them, never the other way round. The
health counterparts live in :mod:`gpuplane.driver.observe.health_view`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """The reference kubelet sends for one ResourceClaim: nothing but its identity."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device kubelet must make available to the claim's containers, by CDI id."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    """The allocation's shareID (consumable capacity); only the v1 API carries it."""


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """The outcome for one claim: devices on success, a non-empty ``error`` on failure."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class UnprepareResult:
    """The outcome of unpreparing one claim: an empty ``error`` means success."""

    error: str = ""


class ClaimPreparer(Protocol):
    """What the gRPC layer calls to do the work; results are keyed by claim uid.

    An implementation should answer every claim it is given. The servicer
    covers for one that does not (or raises) by giving the affected claims an
    error, so a bug here never fails the whole kubelet call.
    """

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """Prepare the claims' devices (idempotently) and return one result per claim uid."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        """Undo :meth:`prepare` (idempotently) and return one result per claim uid."""
        ...
