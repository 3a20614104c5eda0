"""An in-memory, thread-safe :class:`~gpuplane.driver.observe.health_view.HealthSource`.

The driver's health monitor writes device health here; each kubelet health
stream reads from it. A ``threading.Condition`` wakes waiting streams on change.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from gpuplane.driver.observe import health_view


class HealthBoard:
    """Holds the latest health per (pool, device) and a generation that rises on change."""

    def __init__(self, devices: Iterable[health_view.DeviceHealthView] = ()) -> None:
        self._cond = threading.Condition()
        self._devices: dict[tuple[str, str], health_view.DeviceHealthView] = {}
        self._generation = 0
        self._apply(devices, replace=False)

    def update(self, devices: Iterable[health_view.DeviceHealthView]) -> None:
        """Set the health of the given devices, leaving the others as they are."""
        with self._cond:
            if self._apply(devices, replace=False):
                self._cond.notify_all()

    def replace(self, devices: Iterable[health_view.DeviceHealthView]) -> None:
        """Make ``devices`` the complete set (devices not listed are forgotten)."""
        with self._cond:
            if self._apply(devices, replace=True):
                self._cond.notify_all()

    def snapshot(self) -> health_view.HealthSnapshot:
        """Return the current health of every device, sorted by pool and name."""
        with self._cond:
            ordered = tuple(self._devices[key] for key in sorted(self._devices))
            return health_view.HealthSnapshot(generation=self._generation, devices=ordered)

    def wait_changed(self, generation: int, timeout: float) -> bool:
        """Block until the generation differs from ``generation`` or ``timeout`` passes."""
        with self._cond:
            return self._cond.wait_for(lambda: self._generation != generation, timeout=timeout)

    def _apply(self, devices: Iterable[health_view.DeviceHealthView], *, replace: bool) -> bool:
        new = {} if replace else dict(self._devices)
        for device in devices:
            new[(device.pool_name, device.device_name)] = device
        if new == self._devices:
            return False
        self._devices = new
        self._generation += 1
        return True
