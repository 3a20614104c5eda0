"""The binaries a real node runs: kubelet, containerd (with ctr and the runc shim) and the pause program.

* **kubelet** comes from the same ``k8s.io/kubernetes`` module as the control plane
  (``e2e/cluster/k8sbuild``), stamped with the same release, and is cached beside the
  control-plane binaries (``<cache>/k8s/<version key>/kubelet``).
* **containerd**, **ctr** and **containerd-shim-runc-v2** come from the Go module
  ``github.com/containerd/containerd/v2`` pinned in ``e2e/cluster/nodebuild/go.mod``, built
  with the build tag ``no_btrfs`` (no btrfs headers needed), containerd's version
  stamped as its release build does, the shim static (``CGO_ENABLED=0``); cached in
  ``<cache>/containerd/<version>-r<recipe>/``.
* **pause** is the sandbox program of ``e2e/cluster/nodebuild/pause`` (static), cached by the
  hash of its source in ``<cache>/pause/<hash>/``.

Every binary is built once (``e2e.cluster.build.build_one``: a temporary file renamed into
place, progress every 30 s) and reused until its pin or recipe changes; an exclusive
lock per cache directory keeps two processes from building the same thing at once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from e2e.cluster import build

Printer = Callable[[str], None]

NODE_MODULE_DIR = Path(__file__).resolve().parent.parent / "nodebuild"
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_TAGS = ("no_btrfs",)
# Bump when the way the node binaries are built changes (flags, tags, version stamps).
# r1: containerd stamped with its release (version.Version), shim static.
NODE_RECIPE_REVISION = 1
KUBELET_PACKAGE = "k8s.io/kubernetes/cmd/kubelet"

# Binary name -> (Go package, extra environment) for the containerd build.
CONTAINERD_PACKAGES: tuple[tuple[str, str, Mapping[str, str]], ...] = (
    ("containerd", f"{CONTAINERD_MODULE}/cmd/containerd", {}),
    ("ctr", f"{CONTAINERD_MODULE}/cmd/ctr", {}),
    ("containerd-shim-runc-v2", f"{CONTAINERD_MODULE}/cmd/containerd-shim-runc-v2", {"CGO_ENABLED": "0"}),
)


@dataclasses.dataclass(frozen=True)
class NodeBinaries:
    """Where a real node's binaries are."""

    kubelet: Path
    containerd: Path
    ctr: Path
    shim: Path
    pause: Path
    containerd_version: str

    @property
    def containerd_dir(self) -> Path:
        """The directory of containerd and its shim (containerd finds the shim on PATH)."""
        return self.containerd.parent

    def all(self) -> tuple[Path, ...]:
        """Every binary."""
        return (self.kubelet, self.containerd, self.ctr, self.shim, self.pause)


def containerd_version(go_mod: Path) -> str:
    """The containerd release ``e2e/cluster/nodebuild/go.mod`` requires, e.g. ``v2.4.2``."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(CONTAINERD_MODULE)}\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise build.BuildError(f"{go_mod} does not require {CONTAINERD_MODULE}")
    return match.group(1)


def _source_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*.go")):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _build_missing(
    directory: Path,
    todo: Sequence[tuple[str, str, Mapping[str, str], str, Sequence[str]]],
    *,
    module_dir: Path,
    environ: Mapping[str, str],
    out: Printer,
) -> None:
    """Build each (name, package, env, ldflags, tags) whose binary is missing in ``directory``, under a lock."""
    if all(_usable(directory / name) for name, *_ in todo):
        return
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".build.lock").open("w") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out(f"another process is building into {directory}; waiting for it ...")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        missing = [item for item in todo if not _usable(directory / item[0])]
        if not missing:
            return
        go = build.check_go(environ)
        for index, (name, package, extra_env, flags, tags) in enumerate(missing, start=1):
            out(f"[{index}/{len(missing)}] {name}")
            build.build_one(
                go,
                name,
                package,
                directory / name,
                module_dir=module_dir,
                environ={**environ, **extra_env},
                out=out,
                linker_flags=flags,
                tags=tags,
            )


def ensure_node_binaries(
    *,
    root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    out: Printer = print,
    k8s_module_dir: Path = build.MODULE_DIR,
    node_module_dir: Path = NODE_MODULE_DIR,
) -> NodeBinaries:
    """Return the cached node binaries, building whichever is missing (minutes the first time)."""
    env = dict(os.environ if environ is None else environ)
    cache = root or build.cache_root(env)
    pins = build.read_pins(k8s_module_dir / "go.mod")
    k8s_dir = build.bin_paths(pins.version_key, cache).directory
    version = containerd_version(node_module_dir / "go.mod")
    ctrd_dir = cache / "containerd" / f"{version}-r{NODE_RECIPE_REVISION}"
    pause_dir = cache / "pause" / _source_hash(node_module_dir / "pause")
    stamp = f"-s -w -X {CONTAINERD_MODULE}/version.Version={version}"
    _build_missing(
        k8s_dir,
        [("kubelet", KUBELET_PACKAGE, {}, build.ldflags(KUBELET_PACKAGE, pins), ())],
        module_dir=k8s_module_dir,
        environ=env,
        out=out,
    )
    _build_missing(
        ctrd_dir,
        [(name, package, extra, stamp, CONTAINERD_TAGS) for name, package, extra in CONTAINERD_PACKAGES],
        module_dir=node_module_dir,
        environ=env,
        out=out,
    )
    _build_missing(
        pause_dir,
        [("pause", "./pause", {"CGO_ENABLED": "0"}, "-s -w", ())],
        module_dir=node_module_dir,
        environ=env,
        out=out,
    )
    return NodeBinaries(
        kubelet=k8s_dir / "kubelet",
        containerd=ctrd_dir / "containerd",
        ctr=ctrd_dir / "ctr",
        shim=ctrd_dir / "containerd-shim-runc-v2",
        pause=pause_dir / "pause",
        containerd_version=version,
    )
