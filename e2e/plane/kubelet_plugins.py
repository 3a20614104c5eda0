"""The kubelet stand-in's plugin watcher: registration sockets in, connected DRA plugin clients out.

Watches a registry directory for ``*-reg.sock`` and registers each plugin the way kubelet's plugin
manager does (GetInfo, version choice, the dra-health stream opened and followed,
:mod:`e2e.plane.standin_health`, then NotifyRegistrationStatus) through
``KubeletPluginClient.discover``; a socket that is replaced (driver restart) is registered again, a
removed one forgotten. Side effects: gRPC connections to the plugins.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from e2e.plane import standin_health
from gpuplane.driver.plugin import kubelet_client

_log = logging.getLogger("e2e.plane.kubelet")

REGISTRATION_SUFFIX = "-reg.sock"


class PluginRegistry:
    """Kubelet's plugin watcher for DRA: registration sockets in, connected plugin clients out."""

    def __init__(self, registry_dir: Path, on_change: Callable[[], None]) -> None:
        self.registry_dir = registry_dir
        self._on_change = on_change
        self._lock = threading.Lock()
        self._plugins: dict[str, kubelet_client.KubeletPluginClient] = {}
        self._seen: dict[Path, tuple[int, float]] = {}  # socket -> (inode, mtime) registered
        self._by_socket: dict[Path, str] = {}
        self._health: dict[str, standin_health.HealthFollower] = {}
        self.last_error = ""

    def get(self, driver: str) -> kubelet_client.KubeletPluginClient | None:
        """The registered plugin for ``driver``, if any."""
        with self._lock:
            return self._plugins.get(driver)

    def names(self) -> list[str]:
        """Names of registered drivers."""
        with self._lock:
            return sorted(self._plugins)

    def scan(self) -> None:
        """Register new or replaced sockets; forget removed ones."""
        present: dict[Path, tuple[int, float]] = {}
        with contextlib.suppress(FileNotFoundError):
            for path in self.registry_dir.glob(f"*{REGISTRATION_SUFFIX}"):
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    present[path] = (st.st_ino, st.st_mtime)
        changed = False
        for path in [p for p in self._seen if p not in present]:
            del self._seen[path]
            driver = self._by_socket.pop(path, None)
            if driver is not None:
                with self._lock:
                    old = self._plugins.pop(driver, None)
                    old_health = self._health.pop(driver, None)
                if old_health is not None:
                    old_health.stop()
                if old is not None:
                    old.close()
                _log.info("plugin %s deregistered (socket %s removed)", driver, path)
                changed = True
        for path, identity in present.items():
            if self._seen.get(path) == identity:
                continue
            followers: list[standin_health.HealthFollower] = []

            def follow_health(
                client: kubelet_client.KubeletPluginClient,
                found: Path = path,
                into: list[standin_health.HealthFollower] = followers,
            ) -> None:
                # As kubelet: the dra-health stream is opened before NotifyRegistrationStatus.
                name = client.info.name if client.info is not None else found.name.removesuffix(REGISTRATION_SUFFIX)
                into.append(standin_health.HealthFollower(client, name).start())

            try:
                plugin = kubelet_client.KubeletPluginClient.discover(path, timeout=10.0, before_notify=follow_health)
                # Registration gives up after 10 s; NodePrepare/UnprepareResources get kubelet's 45 s. With 10 s,
                # calls queued behind the driver's per-node lock (MPS daemon starts) hit DEADLINE_EXCEEDED.
                plugin.timeout = kubelet_client.DEFAULT_CALL_TIMEOUT
            except Exception as err:  # the driver may still be starting: try again on the next scan
                for follower in followers:
                    follower.stop()
                self.last_error = f"{path}: {err}"
                continue
            info = plugin.info
            driver = info.name if info is not None else path.name.removesuffix(REGISTRATION_SUFFIX)
            with self._lock:
                old = self._plugins.pop(driver, None)
                self._plugins[driver] = plugin
                old_health = self._health.pop(driver, None)
                if followers:
                    self._health[driver] = followers[0]
            if old_health is not None:
                old_health.stop()
            if old is not None:
                old.close()
            self._seen[path] = identity
            self._by_socket[path] = driver
            _log.info("plugin %s registered: endpoint %s, api %s", driver, plugin.endpoint, plugin.version)
            changed = True
        if changed:
            self._on_change()

    def close(self) -> None:
        """Close every plugin connection."""
        with self._lock:
            plugins = list(self._plugins.values())
            self._plugins.clear()
            followers = list(self._health.values())
            self._health.clear()
        for follower in followers:
            follower.stop()
        for plugin in plugins:
            plugin.close()
