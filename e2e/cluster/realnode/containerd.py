"""A real node's containerd: its configuration, its readiness, and images imported into it.

Each real node runs its own containerd (config ``version = 4``, containerd 2.x)
whose every path is the node's own: root, state, the gRPC/ttrpc sockets, the
shims' sockets, runc's state (``Root``), the network namespaces
(``netns_mounts_under_state_dir``), the CNI config and the CDI spec directory
(the node driver's ``--cdi-root``; CDI is always on in containerd 2.x). Nothing
is read from or written to ``/etc/containerd``, ``/opt`` or ``/run/containerd``:
``imports`` is empty, NRI (``/var/run/nri``) is off and the ``opt`` plugin's
path is the node's.

Two settings this machine needs: ``restrict_oom_score_adj = true`` (the VM
drops CAP_SYS_RESOURCE, so runc cannot lower a container's ``oom_score_adj``
below the runtime's own and fails every sandbox otherwise), and the local pause
image pinned as the sandbox image (nothing can be pulled).
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
CRI_NAMESPACE = "k8s.io"
_TOML_BARE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

TomlValue = str | bool | int | Sequence[str]


class ContainerdError(RuntimeError):
    """containerd did not come up, or an import failed."""


@dataclasses.dataclass(frozen=True)
class ContainerdPaths:
    """Everything of one containerd instance."""

    root: Path
    state: Path
    socket: Path
    cni_conf_dir: Path
    cdi_dir: Path
    opt_dir: Path

    @property
    def runc_root(self) -> Path:
        """runc's state directory."""
        return self.state / "runc"

    @property
    def shim_socket_dir(self) -> Path:
        """Where the shims' sockets are."""
        return self.state / "s"


def _key(name: str) -> str:
    return name if set(name) <= _TOML_BARE else f"'{name}'"


def _value(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "") + "'"
    return "[" + ", ".join(_value(v) for v in value) + "]"


def render_toml(top: Mapping[str, TomlValue], tables: Mapping[str, Mapping[str, TomlValue]]) -> str:
    """A TOML document: top-level keys, then ``[table]`` sections (dotted names of quoted parts)."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in top.items()]
    for table, entries in tables.items():
        lines += ["", f"[{'.'.join(_key(part) for part in table.split('|'))}]"]
        lines += [f"  {_key(k)} = {_value(v)}" for k, v in entries.items()]
    return "\n".join(lines) + "\n"


def config(paths: ContainerdPaths, runc: Path, cni_bin_dir: Path, log_level: str = "info") -> str:
    """The containerd configuration of one real node."""
    cri_runtime = "plugins|io.containerd.cri.v1.runtime"
    runc_runtime = f"{cri_runtime}|containerd|runtimes|runc"
    tables: dict[str, dict[str, TomlValue]] = {
        "debug": {"level": log_level},
        "plugins|io.containerd.server.v1.grpc": {"address": str(paths.socket)},
        "plugins|io.containerd.server.v1.ttrpc": {"address": f"{paths.socket}.ttrpc"},
        "plugins|io.containerd.shim.v1.manager": {"socket_dir": str(paths.shim_socket_dir)},
        "plugins|io.containerd.internal.v1.opt": {"path": str(paths.opt_dir)},
        "plugins|io.containerd.image-verifier.v1.bindir": {"bin_dir": str(paths.opt_dir / "image-verifier")},
        "plugins|io.containerd.nri.v1.nri": {"disable": True},
        "plugins|io.containerd.grpc.v1.cri": {"stream_server_address": "127.0.0.1", "stream_server_port": "0"},
        "plugins|io.containerd.cri.v1.images": {"snapshotter": "overlayfs"},
        "plugins|io.containerd.cri.v1.images|pinned_images": {"sandbox": SANDBOX_IMAGE},
        cri_runtime: {
            "restrict_oom_score_adj": True,
            "netns_mounts_under_state_dir": True,
            "cdi_spec_dirs": [str(paths.cdi_dir)],
            "enable_selinux": False,
        },
        f"{cri_runtime}|containerd": {"default_runtime_name": "runc"},
        runc_runtime: {"runtime_type": "io.containerd.runc.v2", "sandboxer": "podsandbox"},
        f"{runc_runtime}|options": {"BinaryName": str(runc), "Root": str(paths.runc_root), "SystemdCgroup": False},
        f"{cri_runtime}|cni": {"bin_dirs": [str(cni_bin_dir)], "conf_dir": str(paths.cni_conf_dir), "max_conf_num": 1},
    }
    top: dict[str, TomlValue] = {
        "version": 4,
        "root": str(paths.root),
        "state": str(paths.state),
        "imports": [],
        "disabled_plugins": [
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.blockfile",
            "io.containerd.snapshotter.v1.erofs",
            "io.containerd.differ.v1.erofs",
            "io.containerd.mount-handler.v1.erofs",
            "io.containerd.tracing.processor.v1.otlp",
            "io.containerd.internal.v1.tracing",
        ],
    }
    return render_toml(top, tables)


def ctr_argv(ctr: Path, socket: Path, *args: str) -> list[str]:
    """``ctr --address <socket> -n k8s.io <args>``."""
    return [str(ctr), f"--address={socket}", f"--namespace={CRI_NAMESPACE}", *args]


def run_ctr(ctr: Path, socket: Path, *args: str, timeout: float = 120.0) -> str:
    """Run ctr against one node's containerd; return stdout, raise ContainerdError on failure."""
    done = subprocess.run(ctr_argv(ctr, socket, *args), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ContainerdError(f"`ctr {' '.join(args)}` on {socket} failed: {done.stderr.strip()}")
    return done.stdout


def wait_ready(ctr: Path, socket: Path, timeout: float = 60.0, alive: object = None) -> None:
    """Wait until containerd answers on ``socket`` (``ctr version``)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if callable(alive):
            alive()
        if socket.exists():
            done = subprocess.run(
                ctr_argv(ctr, socket, "version"), capture_output=True, text=True, timeout=10, check=False
            )
            if done.returncode == 0:
                return
            last = done.stderr.strip()
        time.sleep(0.2)
    raise ContainerdError(f"containerd on {socket} not ready after {timeout:.0f}s ({last or 'no socket'})")


def import_archive(ctr: Path, socket: Path, archive: Path) -> list[str]:
    """Import an OCI (or Docker) image archive into the CRI namespace; return the image names it added."""
    out = run_ctr(ctr, socket, "images", "import", "--no-unpack=false", str(archive), timeout=300)
    names = [line.split()[0] for line in out.splitlines() if line.strip() and not line.startswith("unpacking")]
    return names or [line.strip() for line in out.splitlines() if line.strip()]


def image_names(ctr: Path, socket: Path) -> list[str]:
    """Image names in the CRI namespace."""
    return [line.strip() for line in run_ctr(ctr, socket, "images", "ls", "-q").splitlines() if line.strip()]
