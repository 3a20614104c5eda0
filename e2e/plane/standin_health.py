"""The kubelet stand-in's side of the dra-health stream: opened at registration, followed, re-opened.

kubelet 1.36 (``ResourceHealthStatus``, beta and on) opens ``NodeWatchResources``
on every DRA plugin it registers, before it reports NotifyRegistrationStatus,
and re-opens it every 5 s when it fails or ends. ``HealthFollower`` does the
same for the stand-in (``e2e/plane/kubelet.py``), so a driver sees the same calls from
the stand-in as from kubelet; it keeps the latest health of each device.
"""

from __future__ import annotations

import logging
import threading

import grpc

from gpuplane.driver.observe.health_view import DeviceHealthView
from gpuplane.driver.plugin.kubelet_client import KubeletPluginClient

_log = logging.getLogger("e2e.plane.kubelet.health")

RETRY_S = 5.0
"""kubelet's wait.UntilWithContext period for the stream."""


class HealthFollower:
    """Follows one plugin's health stream in a thread until ``stop``."""

    def __init__(self, plugin: KubeletPluginClient, driver: str) -> None:
        self.plugin = plugin
        self.driver = driver
        self.devices: dict[tuple[str, str], DeviceHealthView] = {}
        """(pool, device) -> the latest health the driver reported."""
        self._stop = threading.Event()
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"health-{driver}", daemon=True)

    def start(self, wait_s: float = 2.0) -> HealthFollower:
        """Open the stream and follow it; return once the driver answered it (or after ``wait_s``)."""
        self._thread.start()
        self._opened.wait(wait_s)
        return self

    def stop(self) -> None:
        """Stop following (closing the plugin's channel ends a stream in progress)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            stream = self.plugin.watch_health()
            try:
                for batch in stream:
                    self._opened.set()
                    for view in batch:
                        key = (view.pool_name, view.device_name)
                        old = self.devices.get(key)
                        self.devices[key] = view
                        if old is None or old.healthy != view.healthy:
                            _log.info("device %s/%s of %s healthy=%s %s", *key, self.driver, view.healthy, view.message)
                    if self._stop.is_set():
                        break
            except (grpc.RpcError, ValueError) as err:  # ValueError: the channel was closed
                if not self._stop.is_set():
                    _log.debug("health stream of %s ended: %s; re-opening in %.0fs", self.driver, err, RETRY_S)
            finally:
                self._opened.set()
                stream.close()
            self._stop.wait(RETRY_S)
