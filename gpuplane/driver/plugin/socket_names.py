"""The names of the driver's two unix sockets, and the sweep of sockets a dead instance left behind.

kubelet (>= 1.33) supports a *seamless* rolling update of a DRA plugin: during a
DaemonSet rollout with ``maxSurge: 1, maxUnavailable: 0`` the old and the new
plugin pod run side by side on a node. Each instance therefore needs socket names of
its own, or the new pod would unlink the old pod's socket (kubelet then deregisters
the driver while the new one is not yet probed) and the old pod's exit would remove
the new pod's. With an *instance* (the pod's UID, from the downward API) the names are

* registration: ``<registry_dir>/<driver>-<instance>-reg.sock``
* DRA service:  ``<plugin_dir>/dra-<instance>.sock``

the convention of the upstream kubelet-plugin helper's rolling-update option. kubelet
keeps every registered instance of a driver, sends calls to the newest and falls back
to the others when one deregisters. Without an instance (a host process, one per node)
the classic ``<driver>-reg.sock`` and ``dra.sock`` are kept.

A pod killed with SIGKILL leaves its sockets behind; kubelet keeps probing such a
socket. :func:`sweep_stale` removes this driver's sockets that nobody listens on
(connect() is refused), never a socket that answers: that is a live instance.
"""

from __future__ import annotations

import errno
import re
import socket
import time
from pathlib import Path

SETTLE_S = 10.0
"""A socket younger than this is left alone: its owner may be between bind() and listen()."""
INSTANCE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
"""A pod UID (RFC 4122 text) or any short DNS-label-like token: safe inside a file name."""


def check_instance(instance: str) -> str:
    """``instance`` if it may be part of a socket name; ValueError naming the rule otherwise."""
    if instance and not INSTANCE_PATTERN.match(instance):
        raise ValueError(
            f"plugin instance {instance!r} cannot name a socket: use the pod UID "
            "(letters, digits and '-', at most 63), e.g. from the downward API's metadata.uid"
        )
    return instance


def registration_socket_path(registry_dir: Path, driver_name: str, instance: str = "") -> Path:
    """Where kubelet's plugin watcher finds this instance's registration socket."""
    check_instance(instance)
    return registry_dir / (f"{driver_name}-{instance}-reg.sock" if instance else f"{driver_name}-reg.sock")


def dra_socket_path(plugin_dir: Path, instance: str = "") -> Path:
    """This instance's DRA service socket (the endpoint GetInfo reports)."""
    check_instance(instance)
    return plugin_dir / (f"dra-{instance}.sock" if instance else "dra.sock")


def is_listening(path: Path, timeout: float = 1.0) -> bool:
    """Whether a process accepts connections on the unix socket ``path``.

    Only ECONNREFUSED (a socket file nobody listens on) and a vanished file count as
    not listening; anything else (a timeout: a busy peer) counts as alive.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(str(path))
    except FileNotFoundError:
        return False
    except OSError as err:
        return err.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()
    return True


def _ours(registry_dir: Path, plugin_dir: Path, driver_name: str) -> list[Path]:
    found = [*registry_dir.glob(f"{driver_name}-*reg.sock"), *plugin_dir.glob("dra*.sock")]
    return sorted(p for p in found if p.is_socket())


def sweep_stale(
    registry_dir: Path, plugin_dir: Path, driver_name: str, *, settle_s: float = SETTLE_S, now: float | None = None
) -> list[Path]:
    """Remove this driver's sockets in both directories that nobody listens on; return the removed."""
    removed: list[Path] = []
    clock = time.time() if now is None else now
    for path in _ours(registry_dir, plugin_dir, driver_name):
        try:
            young = clock - path.lstat().st_mtime < settle_s
        except FileNotFoundError:
            continue
        if young or is_listening(path):
            continue
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
