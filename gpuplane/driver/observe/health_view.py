"""Device health as the kubelet health stream reports it: plain values and the ``HealthSource`` protocol.

Nothing here knows about protobuf or gRPC: the DRAResourceHealth servicer
(:mod:`gpuplane.driver.plugin.health_servicer`) translates these dataclasses
into wire messages, so the health monitor can be written and tested without
either. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
    :meth:`wait_changed` reports. :class:`gpuplane.driver.observe.health_board.HealthBoard`
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
