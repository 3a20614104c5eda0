"""The DRAResourceHealth gRPC service: streams device health from a HealthSource to kubelet.

Kubelet (gate ResourceHealthStatus) opens ``NodeWatchResources`` after
registration and keeps it open, reopening it every few seconds if it ends.
Each message lists every device's health: the first right away, then one
after every change the source reports, and the same list again at least every
``REFRESH_S`` seconds, until the client goes away or the server stops. The
refresh matters: kubelet stamps each device's health with the time it received
it and reports it Unknown (in pod status) once that is older than the device's
``health_check_timeout_seconds`` (30 s when unset, kubelet 1.36
``pkg/kubelet/cm/dra/healthinfo.go``); a stream that sent only changes turned
every healthy device Unknown half a minute after the last change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import structlog

from gpuplane.driver._proto.drahealth.v1alpha1 import api_pb2 as health_pb2
from gpuplane.driver.observe import health_view
from gpuplane.driver.plugin import wire

_log = structlog.get_logger(__name__)

REFRESH_S = 10.0
"""Resend every device's health at least this often (kubelet's default trust is 30 s)."""

GRPC_SERVICE = "v1alpha1.DRAResourceHealth"
"""The full gRPC service name (proto package ``v1alpha1``), also the version string kubelet sees."""


def to_wire_status(healthy: bool | None) -> int:
    """Map a tri-state health to the HealthStatus enum."""
    if healthy is None:
        return int(health_pb2.UNKNOWN)
    return int(health_pb2.HEALTHY if healthy else health_pb2.UNHEALTHY)


def from_wire_status(status: int) -> bool | None:
    """Map the HealthStatus enum back to a tri-state health."""
    if status == health_pb2.HEALTHY:
        return True
    if status == health_pb2.UNHEALTHY:
        return False
    return None


def to_response(snapshot: health_view.HealthSnapshot) -> Any:
    """Build one NodeWatchResourcesResponse that lists every device in ``snapshot``."""
    response = health_pb2.NodeWatchResourcesResponse()
    for device in snapshot.devices:
        response.devices.add(
            device=health_pb2.DeviceIdentifier(pool_name=device.pool_name, device_name=device.device_name),
            health=to_wire_status(device.healthy),
            last_updated_time=device.last_updated,
            health_check_timeout_seconds=device.timeout_s,
            message=device.message,
        )
    return response


class ResourceHealthServicer:
    """Serves ``v1alpha1.DRAResourceHealth`` from one :class:`~gpuplane.driver.observe.health_view.HealthSource`."""

    def __init__(
        self, source: health_view.HealthSource, *, poll_interval: float = 0.5, refresh_interval: float = REFRESH_S
    ) -> None:
        self._source = source
        self._poll_interval = poll_interval
        self._refresh_interval = refresh_interval
        self._stopping = threading.Event()

    def stop(self) -> None:
        """End all open streams (each within one poll interval) and refuse to loop further."""
        self._stopping.set()

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        """Send the current health, then again after every change and at least every refresh interval."""
        log = _log.bind(peer=context.peer())
        log.info("health stream opened")
        sent: int | None = None
        sent_at = 0.0
        try:
            while context.is_active() and not self._stopping.is_set():
                snapshot = self._source.snapshot()
                now = time.monotonic()
                if snapshot.generation != sent or now - sent_at >= self._refresh_interval:
                    yield to_response(snapshot)
                    sent, sent_at = snapshot.generation, now
                self._source.wait_changed(sent, self._poll_interval)
        finally:
            log.info("health stream closed")


def add_resource_health_service(server: grpc.Server, servicer: ResourceHealthServicer) -> None:
    """Register ``servicer`` as the DRAResourceHealth service on ``server``."""
    wire.add_resource_health(servicer, server)
