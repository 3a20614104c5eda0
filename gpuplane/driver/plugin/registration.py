"""The kubelet plugin Registration service (``pluginregistration.Registration``).

Kubelet's plugin watcher finds the registration socket, calls GetInfo, checks
the answer, connects to the advertised DRA endpoint, and reports the outcome
with NotifyRegistrationStatus. This module answers the first and records the
second; :attr:`RegistrationServicer.registered` tells the driver's readiness
probe whether kubelet accepted the plugin.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from gpuplane.driver._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from gpuplane.driver.plugin import wire

_log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
"""The health service's version string (its gRPC service name too).

Advertised after the DRA versions when health is served, as upstream kubeletplugin does;
kubelet picks its DRAPlugin version from the list and skips names it does not know.
"""


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    """What kubelet last reported through NotifyRegistrationStatus."""

    plugin_registered: bool
    error: str = ""


class RegistrationServicer:
    """Answers GetInfo for one DRA driver and records kubelet's registration verdict."""

    def __init__(self, driver_name: str, endpoint: str, supported_versions: Sequence[str]) -> None:
        if not supported_versions:
            raise ValueError("a DRA plugin must advertise at least one service version")
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.supported_versions = tuple(supported_versions)
        self.registered = threading.Event()
        """Set while kubelet's latest report says the plugin is registered."""
        self._lock = threading.Lock()
        self._status: RegistrationStatus | None = None

    @property
    def status(self) -> RegistrationStatus | None:
        """Kubelet's latest report, or None before the first one."""
        with self._lock:
            return self._status

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Tell kubelet who we are and where the DRA service listens."""
        _log.info("kubelet asked for plugin info", driver=self.driver_name, endpoint=self.endpoint)
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(self.supported_versions),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Record whether kubelet registered the plugin."""
        status = RegistrationStatus(plugin_registered=bool(request.plugin_registered), error=request.error)
        with self._lock:
            self._status = status
            if status.plugin_registered:
                self.registered.set()
            else:
                self.registered.clear()
        if status.plugin_registered:
            _log.info("kubelet registered the plugin", driver=self.driver_name)
        else:
            _log.error("kubelet rejected the plugin", driver=self.driver_name, error=status.error)
        return reg_pb2.RegistrationStatusResponse()


def add_registration_service(server: grpc.Server, servicer: RegistrationServicer) -> None:
    """Register ``servicer`` as the Registration service on ``server``."""
    wire.add_registration(servicer, server)
