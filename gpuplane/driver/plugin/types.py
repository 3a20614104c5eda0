"""Plain values and interfaces shared by the kubelet-facing gRPC layer and the rest of the driver.

Nothing here knows about protobuf or gRPC: the servicers translate between
these dataclasses and the wire messages, so the prepare/unprepare state and
the health monitor can be written and tested without either.
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


@dataclass(frozen=True, slots=True)
class DeviceHealthView:
    """The health of one published device, as the kubelet health stream reports it."""

    pool_name: str
    device_name: str
    healthy: bool | None
    """True healthy, False unhealthy, None unknown."""
    message: str = ""
    last_updated: int = 0
    """Unix time in seconds when the status was last determined."""
    timeout_s: int = 0
    """How long kubelet may trust this status; 0 lets kubelet use its default."""


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """All devices' health at one moment; ``generation`` rises with every change."""

    generation: int
    devices: tuple[DeviceHealthView, ...]


class HealthSource(Protocol):
    """A changing view of device health that the DRAResourceHealth stream follows.

    The stream sends :meth:`snapshot` once, then again after every change
    :meth:`wait_changed` reports. :class:`driver.plugin.health_board.HealthBoard`
    is the in-memory implementation the driver's health monitor writes to.
    """

    def snapshot(self) -> HealthSnapshot:
        """Return the current health of every device."""
        ...

    def wait_changed(self, generation: int, timeout: float) -> bool:
        """Block until the generation differs from ``generation`` or ``timeout`` passes.

        Returns True when it changed. Must return promptly (within ``timeout``)
        so that streams notice a client that went away.
        """
        ...
