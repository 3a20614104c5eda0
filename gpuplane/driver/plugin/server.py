"""PluginServer: the two unix-socket gRPC servers through which kubelet reaches the driver.

* the registration socket ``<registry_dir>/<driver>[-<instance>]-reg.sock`` serves
  ``pluginregistration.Registration``; kubelet's plugin watcher finds it there;
* the DRA socket ``<plugin_dir>/dra[-<instance>].sock`` serves ``DRAPlugin`` v1 and
  v1beta1, ``v1alpha1.DRAResourceHealth`` when a HealthSource is given, and
  the standard ``grpc.health.v1.Health`` (SERVING once started).

Both are synchronous ``grpc.server`` instances on a thread pool: preparing a
claim blocks on the API server and hardware anyway, and threads keep the
preparer interface plain. The DRA server starts first so that kubelet never
finds a registration socket whose endpoint does not answer yet; the
registration socket is bound under a hidden name (kubelet ignores dot-files)
and renamed into place once it listens.

The *instance* (the pod UID in a DaemonSet) makes the names unique per plugin pod, so
that an old and a new pod can serve one node side by side during a rolling update
(``socket_names``); at start the server removes this driver's sockets nobody listens on.
"""

from __future__ import annotations

import os
import stat
import threading
from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc
import structlog

from gpuplane.driver.observe import health_view
from gpuplane.driver.plugin import call_log, dra_servicer, grpc_health, health_servicer, registration, socket_names
from gpuplane.driver.prepare import contract

_log = structlog.get_logger(__name__)

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DRA_SOCKET_NAME = "dra.sock"
"""The DRA socket's name without an instance."""
MAX_SOCKET_PATH = 107
"""sockaddr_un.sun_path holds 108 bytes including the terminating NUL."""


def registration_socket_path(registry_dir: Path, driver_name: str, instance: str = "") -> Path:
    """Where kubelet's plugin watcher looks for this driver's (instance's) registration socket."""
    return socket_names.registration_socket_path(registry_dir, driver_name, instance)


def _check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"unix socket path longer than {MAX_SOCKET_PATH} bytes: {path}")


def _remove_socket(path: Path) -> None:
    """Remove a socket (or stale file) at ``path``; a missing file is fine."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"expected a socket, found a directory: {path}")
    path.unlink(missing_ok=True)


class PluginServer:
    """Owns the registration and DRA gRPC servers of one driver on one node."""

    def __init__(
        self,
        driver_name: str,
        preparer: contract.ClaimPreparer,
        *,
        registry_dir: str | os.PathLike[str] = DEFAULT_REGISTRY_DIR,
        plugin_dir: str | os.PathLike[str] | None = None,
        health_source: health_view.HealthSource | None = None,
        timing: dra_servicer.TimingHook | None = None,
        max_workers: int = 8,
        socket_mode: int = 0o600,
        stream_poll_interval: float = 0.5,
        stream_refresh_interval: float = health_servicer.REFRESH_S,
        instance: str = "",
    ) -> None:
        if not driver_name:
            raise ValueError("driver_name must not be empty")
        self.driver_name = driver_name
        self.registry_dir = Path(registry_dir).absolute()
        self.plugin_dir = Path(plugin_dir if plugin_dir is not None else DEFAULT_PLUGINS_DIR / driver_name).absolute()
        self.instance = socket_names.check_instance(instance)
        self.registration_socket = registration_socket_path(self.registry_dir, driver_name, instance)
        self.dra_socket = socket_names.dra_socket_path(self.plugin_dir, instance)
        # Bound outside the registry dir and renamed into it, so kubelet's plugin watcher sees the socket
        # appear once, complete (a hidden socket in the watched dir makes kubelet log a failed stat).
        # With an instance the name is short: the plugin dir plus a pod UID must fit AF_UNIX's 107 bytes.
        hidden = f".reg-{instance}.tmp" if instance else f".{self.registration_socket.name}.tmp"
        self._hidden_registration_socket = self.plugin_dir / hidden
        for path in (self.registration_socket, self._hidden_registration_socket, self.dra_socket):
            _check_socket_path(path)

        self._preparer = preparer
        self._timing = timing
        self._max_workers = max_workers
        self._socket_mode = socket_mode
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False

        self._resource_health = (
            health_servicer.ResourceHealthServicer(
                health_source, poll_interval=stream_poll_interval, refresh_interval=stream_refresh_interval
            )
            if health_source is not None
            else None
        )
        grpc_services = [dra_servicer.V1_GRPC_SERVICE, dra_servicer.V1BETA1_GRPC_SERVICE]
        versions = [dra_servicer.V1_SERVICE, dra_servicer.V1BETA1_SERVICE]
        if self._resource_health is not None:
            grpc_services.append(health_servicer.GRPC_SERVICE)
            versions.append(registration.HEALTH_SERVICE)
        self.grpc_health = grpc_health.GrpcHealthServicer(grpc_services, poll_interval=stream_poll_interval)
        self.registration = registration.RegistrationServicer(driver_name, str(self.dra_socket), versions)

        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None

    @property
    def registered(self) -> threading.Event:
        """Set once kubelet reports that it registered the plugin (cleared if it reports failure)."""
        return self.registration.registered

    def start(self) -> None:
        """Bind both sockets and start serving: DRA first, then registration."""
        with self._lock:
            if self._started:
                raise RuntimeError("PluginServer already started")
            self._started = True
        try:
            self._sweep_stale()
            self._dra_server = self._start_dra_server()
            self._reg_server = self._start_registration_server()
        except BaseException:
            self.stop(grace=0)
            raise
        self.grpc_health.set_all(grpc_health.SERVING)
        _log.info(
            "plugin serving",
            driver=self.driver_name,
            registration_socket=str(self.registration_socket),
            dra_socket=str(self.dra_socket),
            versions=list(self.registration.supported_versions),
        )

    def stop(self, grace: float | None = 5.0) -> None:
        """Withdraw registration, let running calls finish within ``grace`` seconds, remove sockets."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        # Removing the registration socket first makes kubelet deregister the
        # plugin before its endpoint goes away.
        _remove_socket(self.registration_socket)
        self.grpc_health.shutdown()
        if self._resource_health is not None:
            self._resource_health.stop()
        waits = []
        for server in (self._reg_server, self._dra_server):
            if server is not None:
                waits.append(server.stop(grace))
        for done in waits:
            done.wait()
        for path in (self._hidden_registration_socket, self.registration_socket, self.dra_socket):
            _remove_socket(path)
        _log.info("plugin stopped", driver=self.driver_name)

    def __enter__(self) -> PluginServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _sweep_stale(self) -> None:
        """Remove sockets of this driver that a dead instance left (nobody listens); a live one's stay."""
        if not (self.registry_dir.is_dir() and self.plugin_dir.is_dir()):
            return
        for path in socket_names.sweep_stale(self.registry_dir, self.plugin_dir, self.driver_name):
            _log.info("removed a stale plugin socket nobody listens on", path=str(path))

    def _new_server(self) -> grpc.Server:
        return grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="gpuplane-grpc"),
            interceptors=[call_log.CallLog()],
            options=[("grpc.so_reuseport", 0)],
        )

    def _bind(self, server: grpc.Server, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_socket(path)
        server.add_insecure_port(f"unix:{path}")
        os.chmod(path, self._socket_mode)

    def _start_dra_server(self) -> grpc.Server:
        server = self._new_server()
        dra_servicer.add_dra_services(server, self._preparer, self._timing)
        if self._resource_health is not None:
            health_servicer.add_resource_health_service(server, self._resource_health)
        grpc_health.add_grpc_health_service(server, self.grpc_health)
        self._bind(server, self.dra_socket)
        server.start()
        return server

    def _start_registration_server(self) -> grpc.Server:
        server = self._new_server()
        registration.add_registration_service(server, self.registration)
        hidden = self._hidden_registration_socket
        self._bind(server, hidden)
        server.start()
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        _remove_socket(self.registration_socket)
        os.replace(hidden, self.registration_socket)
        return server
