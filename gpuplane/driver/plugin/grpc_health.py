"""The standard gRPC health service (``grpc.health.v1.Health``) for the DRA socket.

A small implementation over the protocol's own proto, so the driver needs no
grpcio-health-checking. The empty service name stands for the server as a
whole; each served gRPC service is listed by its full name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from gpuplane.driver._proto.grpc.health.v1 import health_pb2
from gpuplane.driver.plugin import wire

UNKNOWN = int(health_pb2.HealthCheckResponse.UNKNOWN)
SERVING = int(health_pb2.HealthCheckResponse.SERVING)
NOT_SERVING = int(health_pb2.HealthCheckResponse.NOT_SERVING)
SERVICE_UNKNOWN = int(health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)

GRPC_SERVICE = "grpc.health.v1.Health"


class GrpcHealthServicer:
    """Serving status per service name, answered through Check, List and Watch."""

    def __init__(self, services: Iterable[str] = (), *, poll_interval: float = 0.5) -> None:
        self._cond = threading.Condition()
        self._statuses: dict[str, int] = {name: NOT_SERVING for name in ("", *services)}
        self._shutdown = False
        self._poll_interval = poll_interval

    def set_all(self, status: int) -> None:
        """Give every known service (and the server as a whole) ``status``."""
        with self._cond:
            if not self._shutdown:
                self._statuses = dict.fromkeys(self._statuses, status)
                self._cond.notify_all()

    def shutdown(self) -> None:
        """Report NOT_SERVING for everything from now on and end open watches."""
        with self._cond:
            self._statuses = dict.fromkeys(self._statuses, NOT_SERVING)
            self._shutdown = True
            self._cond.notify_all()

    def status(self, service: str = "") -> int | None:
        """The current status of ``service``, or None if it is unknown."""
        with self._cond:
            return self._statuses.get(service)

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Answer the service's status; NOT_FOUND for an unknown service."""
        status = self.status(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)  # type: ignore[arg-type]

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Answer every known service's status."""
        with self._cond:
            statuses = dict(self._statuses)
        response = health_pb2.HealthListResponse()
        for name, status in statuses.items():
            response.statuses[name].status = status  # type: ignore[assignment]
        return response

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        """Stream the service's status now and after every change."""
        last: int | None = None
        while context.is_active():
            with self._cond:
                status = self._statuses.get(request.service, SERVICE_UNKNOWN)
                done = self._shutdown
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)  # type: ignore[arg-type]
                last = status
            if done:
                return
            self._wait_for_change(request.service, status)

    def _wait_for_change(self, service: str, seen: int) -> None:
        with self._cond:
            self._cond.wait_for(
                lambda: self._shutdown or self._statuses.get(service, SERVICE_UNKNOWN) != seen,
                timeout=self._poll_interval,
            )


def add_grpc_health_service(server: grpc.Server, servicer: GrpcHealthServicer) -> None:
    """Register ``servicer`` as ``grpc.health.v1.Health`` on ``server``."""
    wire.add_grpc_health(servicer, server)
