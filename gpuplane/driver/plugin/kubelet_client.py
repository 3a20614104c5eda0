"""KubeletPluginClient: kubelet's side of the plugin protocol, for tests, benchmarks and the e2e stand-in.

It does what kubelet's DRA plugin manager does: GetInfo on the registration
socket, check the plugin type, pick the first advertised DRAPlugin version it
knows (v1 before v1beta1), connect to the advertised endpoint, report
NotifyRegistrationStatus, then call NodePrepareResources /
NodeUnprepareResources with a per-call timeout (45 s, as kubelet) and watch
device health. Results come back as the driver's own plain dataclasses.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

import grpc

from gpuplane.driver._proto.dra.v1 import api_pb2 as v1_pb2
from gpuplane.driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from gpuplane.driver._proto.drahealth.v1alpha1 import api_pb2 as health_pb2
from gpuplane.driver._proto.grpc.health.v1 import health_pb2 as grpc_health_pb2
from gpuplane.driver._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from gpuplane.driver.observe import health_view
from gpuplane.driver.plugin import dra_servicer, health_servicer, registration, wire
from gpuplane.driver.prepare import contract

DEFAULT_CALL_TIMEOUT = 45.0
"""Kubelet's per-call timeout for DRA plugin calls."""

KNOWN_VERSIONS = (dra_servicer.V1_SERVICE, dra_servicer.V1BETA1_SERVICE)
"""The DRAPlugin versions this client speaks, most preferred first (kubelet's order)."""

_API: dict[str, tuple[ModuleType, wire.NewStub]] = {
    dra_servicer.V1_SERVICE: (v1_pb2, wire.dra_v1_stub),
    dra_servicer.V1BETA1_SERVICE: (v1beta1_pb2, wire.dra_v1beta1_stub),
}


class RegistrationError(Exception):
    """The plugin's registration answer is unusable (as kubelet would reject it)."""


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """The plugin's GetInfo answer."""

    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


def _target(path: str) -> str:
    return path if path.startswith("unix:") else f"unix:{path}"


def get_info(registration_socket: str | os.PathLike[str], timeout: float = DEFAULT_CALL_TIMEOUT) -> PluginInfo:
    """Call GetInfo on a registration socket."""
    with grpc.insecure_channel(_target(os.fspath(registration_socket))) as channel:
        answer = wire.registration_stub(channel).GetInfo(reg_pb2.InfoRequest(), timeout=timeout)
    return PluginInfo(
        type=answer.type,
        name=answer.name,
        endpoint=answer.endpoint,
        supported_versions=tuple(answer.supported_versions),
    )


def notify_registration_status(
    registration_socket: str | os.PathLike[str],
    registered: bool,
    error: str = "",
    timeout: float = DEFAULT_CALL_TIMEOUT,
) -> None:
    """Call NotifyRegistrationStatus on a registration socket."""
    with grpc.insecure_channel(_target(os.fspath(registration_socket))) as channel:
        wire.registration_stub(channel).NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=timeout
        )


def choose_version(supported: Sequence[str], force_version: str | None = None) -> str:
    """The first advertised version this client knows, or ``force_version`` if advertised."""
    if force_version is not None:
        if force_version not in KNOWN_VERSIONS:
            raise ValueError(f"unknown DRAPlugin version {force_version!r}")
        if force_version not in supported:
            raise RegistrationError(f"plugin does not offer {force_version!r} (offers {list(supported)})")
        return force_version
    for version in supported:
        if version in KNOWN_VERSIONS:
            return version
    raise RegistrationError(f"none of the plugin's versions {list(supported)} is known ({list(KNOWN_VERSIONS)})")


def _prepare_result(entry: Any, with_share_id: bool) -> contract.PrepareResult:
    if entry.error:
        return contract.PrepareResult(error=entry.error)
    devices = tuple(
        contract.PreparedDevice(
            request_names=tuple(device.request_names),
            pool_name=device.pool_name,
            device_name=device.device_name,
            cdi_device_ids=tuple(device.cdi_device_ids),
            share_id=device.share_id if with_share_id and device.HasField("share_id") else None,
        )
        for device in entry.devices
    )
    return contract.PrepareResult(devices=devices)


class KubeletPluginClient:
    """A connection to one plugin's DRA endpoint, speaking one DRAPlugin version."""

    def __init__(
        self,
        endpoint: str,
        version: str = dra_servicer.V1_SERVICE,
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        info: PluginInfo | None = None,
    ) -> None:
        if version not in _API:
            raise ValueError(f"unknown DRAPlugin version {version!r}")
        self.endpoint = endpoint
        self.version = version
        """The DRAPlugin API this client speaks: "v1.DRAPlugin" or "v1beta1.DRAPlugin"."""
        self.timeout = timeout
        self.info = info
        self._messages, new_stub = _API[version]
        self._channel = grpc.insecure_channel(_target(endpoint))
        self._dra = new_stub(self._channel)
        self._health = wire.resource_health_stub(self._channel)
        self._grpc_health = wire.grpc_health_stub(self._channel)

    @classmethod
    def discover(
        cls,
        registration_socket: str | os.PathLike[str],
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        force_version: str | None = None,
        before_notify: Callable[[KubeletPluginClient], None] | None = None,
    ) -> KubeletPluginClient:
        """Register the plugin behind ``registration_socket`` the way kubelet does and connect to it.

        ``before_notify`` runs once the client is connected and before NotifyRegistrationStatus: kubelet
        opens the dra-health stream there (1.36), so a caller that follows health does it in this hook.
        """
        info = get_info(registration_socket, timeout)
        try:
            if info.type != registration.PLUGIN_TYPE:
                raise RegistrationError(f"plugin type is {info.type!r}, want {registration.PLUGIN_TYPE!r}")
            if not info.endpoint:
                raise RegistrationError("plugin advertised no endpoint")
            version = choose_version(info.supported_versions, force_version)
        except RegistrationError as exc:
            notify_registration_status(registration_socket, False, str(exc), timeout)
            raise
        client = cls(info.endpoint, version, timeout=timeout, info=info)
        if before_notify is not None:
            before_notify(client)
        notify_registration_status(registration_socket, True, "", timeout)
        return client

    def prepare(self, claims: Sequence[contract.ClaimRef]) -> dict[str, contract.PrepareResult]:
        """NodePrepareResources; results keyed by claim uid."""
        request = self._messages.NodePrepareResourcesRequest(claims=[self._claim(c) for c in claims])
        response = self._dra.NodePrepareResources(request, timeout=self.timeout)
        with_share_id = self.version == dra_servicer.V1_SERVICE
        return {uid: _prepare_result(entry, with_share_id) for uid, entry in response.claims.items()}

    def unprepare(self, claims: Sequence[contract.ClaimRef]) -> dict[str, contract.UnprepareResult]:
        """NodeUnprepareResources; results keyed by claim uid."""
        request = self._messages.NodeUnprepareResourcesRequest(claims=[self._claim(c) for c in claims])
        response = self._dra.NodeUnprepareResources(request, timeout=self.timeout)
        return {uid: contract.UnprepareResult(error=entry.error) for uid, entry in response.claims.items()}

    def watch_health(self, timeout: float | None = None) -> Generator[list[health_view.DeviceHealthView], None, None]:
        """Follow NodeWatchResources; close the generator to cancel the stream."""
        call = self._health.NodeWatchResources(health_pb2.NodeWatchResourcesRequest(), timeout=timeout)
        try:
            for response in call:
                yield [
                    health_view.DeviceHealthView(
                        pool_name=item.device.pool_name,
                        device_name=item.device.device_name,
                        healthy=health_servicer.from_wire_status(item.health),
                        message=item.message,
                        last_updated=item.last_updated_time,
                        timeout_s=item.health_check_timeout_seconds,
                    )
                    for item in response.devices
                ]
        finally:
            call.cancel()

    def check_health(self, service: str = "") -> str:
        """grpc.health.v1 Check on the DRA socket; returns the status name, e.g. "SERVING"."""
        response = self._grpc_health.Check(grpc_health_pb2.HealthCheckRequest(service=service), timeout=self.timeout)
        return str(grpc_health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> KubeletPluginClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _claim(self, claim: contract.ClaimRef) -> Any:
        return self._messages.Claim(namespace=claim.namespace, uid=claim.uid, name=claim.name)
