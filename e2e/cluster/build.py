"""Build etcd and the Kubernetes binaries from the pinned Go module, once, into a cache.

The Go module in ``e2e/cluster/k8sbuild/v<minor>`` (the release :mod:`e2e.cluster.releases` selects)
pins ``k8s.io/kubernetes`` (with every staging
module replaced) and ``go.etcd.io/etcd/server/v3``. The cache directory is
named after those pins plus ``RECIPE_REVISION`` (the build recipe: flags,
version stamps), so changing a pin or the recipe builds into a fresh directory.
The Kubernetes binaries are stamped with their release (``kubectl version``,
``/version`` and the components' user agents report ``v1.37.2``, not
``v0.0.0-master``), as the upstream release build does through ``-X`` flags.
Each binary is built into a temporary name and renamed into place, so a
half-written binary is never cached; an exclusive lock on the cache
directory keeps two processes from building the same binaries at once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from e2e.cluster import releases

MODULE_DIR = releases.RUNNING.module_dir
"""The Go module of the release this run uses (:mod:`e2e.cluster.releases`)."""
MIN_GO = (1, 26)
HEARTBEAT_S = 30.0
# Bump when the way binaries are built changes, so that cached binaries built the old way are rebuilt once.
# r2: Kubernetes binaries stamped with their version (k8s.io/component-base/version).
RECIPE_REVISION = 2
VERSION_PACKAGE = "k8s.io/component-base/version"

KUBERNETES_MODULE = "k8s.io/kubernetes"
ETCD_MODULE = "go.etcd.io/etcd/server/v3"

# Binary name -> Go package, in build order.
PACKAGES: tuple[tuple[str, str], ...] = (
    ("etcd", ETCD_MODULE),
    ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
    ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    ("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
)

Printer = Callable[[str], None]


class BuildError(RuntimeError):
    """A binary could not be built, or the Go toolchain is unusable."""


@dataclasses.dataclass(frozen=True)
class BinPaths:
    """Where the control-plane binaries of one version live."""

    directory: Path
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    kubectl: Path

    @classmethod
    def in_directory(cls, directory: Path) -> BinPaths:
        """The expected paths of every binary in ``directory`` (existing or not)."""
        return cls(
            directory=directory,
            etcd=directory / "etcd",
            kube_apiserver=directory / "kube-apiserver",
            kube_scheduler=directory / "kube-scheduler",
            kube_controller_manager=directory / "kube-controller-manager",
            kubectl=directory / "kubectl",
        )

    def by_name(self) -> dict[str, Path]:
        """Binary file name -> path."""
        return {path.name: path for path in self.all()}

    def all(self) -> tuple[Path, ...]:
        """Every binary path."""
        return (
            self.etcd,
            self.kube_apiserver,
            self.kube_scheduler,
            self.kube_controller_manager,
            self.kubectl,
        )

    def missing(self) -> list[Path]:
        """Paths that are not an executable file."""
        return [p for p in self.all() if not (p.is_file() and os.access(p, os.X_OK))]


@dataclasses.dataclass(frozen=True)
class ModulePins:
    """The versions the build module pins."""

    kubernetes: str
    etcd: str
    go: str

    @property
    def version_key(self) -> str:
        """Cache directory name, e.g. ``v1.37.2-etcd3.7.0-r2``."""
        return f"{self.kubernetes}-etcd{self.etcd.removeprefix('v')}-r{RECIPE_REVISION}"


def ldflags(package: str, pins: ModulePins) -> str:
    """Linker flags for ``package``: stripped, and Kubernetes commands stamped with the pinned release."""
    flags = ["-s", "-w"]
    if package.startswith(f"{KUBERNETES_MODULE}/"):
        match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+(?:[-+].*)?", pins.kubernetes)
        if match is None:
            raise BuildError(f"cannot derive a version stamp from {KUBERNETES_MODULE} {pins.kubernetes}")
        flags += [
            "-X",
            f"{VERSION_PACKAGE}.gitVersion={pins.kubernetes}",
            "-X",
            f"{VERSION_PACKAGE}.gitMajor={match.group(1)}",
            "-X",
            f"{VERSION_PACKAGE}.gitMinor={match.group(2)}",
            "-X",
            f"{VERSION_PACKAGE}.gitTreeState=clean",
        ]
    return " ".join(flags)


def required_version(go_mod: Path, module: str, text: str | None = None) -> str:
    """The version of ``module`` that ``go_mod`` requires (``text``: its content, when already read)."""
    text = go_mod.read_text() if text is None else text
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{go_mod} does not require {module}")
    return match.group(1)


def read_pins(go_mod: Path) -> ModulePins:
    """Read the Kubernetes and etcd requirements and the Go version from a go.mod."""
    text = go_mod.read_text()

    def required(module: str) -> str:
        return required_version(go_mod, module, text)

    go_match = re.search(r"^go\s+(\S+)", text, re.MULTILINE)
    return ModulePins(
        kubernetes=required(KUBERNETES_MODULE),
        etcd=required(ETCD_MODULE),
        go=go_match.group(1) if go_match else ".".join(map(str, MIN_GO)),
    )


def cache_root(environ: Mapping[str, str]) -> Path:
    """``$GPUPLANE_CACHE`` or ``~/.cache/gpuplane``."""
    configured = environ.get("GPUPLANE_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "gpuplane"


def bin_paths(version_key: str, root: Path) -> BinPaths:
    """Paths of the binaries for ``version_key`` under the cache ``root``."""
    return BinPaths.in_directory(root / "k8s" / version_key)


def parse_go_version(output: str) -> tuple[int, int] | None:
    """``go version go1.26.8 linux/amd64`` -> ``(1, 26)``."""
    match = re.search(r"\bgo(\d+)\.(\d+)", output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_go(environ: Mapping[str, str]) -> str:
    """Return the path of a usable ``go``, or raise BuildError saying what to do."""
    go = shutil.which("go", path=environ.get("PATH"))
    wanted = ".".join(map(str, MIN_GO))
    if go is None:
        raise BuildError(
            f"`go` was not found on PATH. Building the control plane needs Go >= {wanted}: "
            "install it from https://go.dev/dl/ (or your package manager) and put it on PATH, "
            "or place prebuilt binaries in the cache directory."
        )
    out = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    version = parse_go_version(out)
    if version is None or version < MIN_GO:
        raise BuildError(
            f"{go} reports {out.strip() or 'no version'}; Kubernetes {releases.RUNNING.minor} needs Go >= {wanted}. "
            "Install a newer Go from https://go.dev/dl/ and put it first on PATH "
            "(GOTOOLCHAIN=auto can also fetch one when a module proxy is reachable)."
        )
    return go


def fmt_seconds(seconds: float, decimals: int = 0) -> str:
    """``75.2`` -> ``1m15s``; under a minute ``12s`` (with ``decimals``: ``12.3s``)."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.{decimals}f}s"


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of ``path`` (or a note that there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def build_one(
    go: str,
    name: str,
    package: str,
    dest: Path,
    *,
    module_dir: Path,
    environ: Mapping[str, str],
    out: Printer,
    linker_flags: str = "-s -w",
    tags: Sequence[str] = (),
) -> float:
    """Build ``package`` into ``dest`` via a temporary file; return seconds taken."""
    tmp = dest.with_name(f".{name}.tmp-{os.getpid()}")
    log = dest.with_name(f".{name}.build.log")
    env = dict(environ)
    env["GOFLAGS"] = "-mod=mod"
    cmd = [go, "build", "-trimpath", f"-ldflags={linker_flags}"]
    cmd += [f"-tags={','.join(tags)}"] if tags else []
    cmd += ["-o", str(tmp), package]
    out(f"building {name} ({package}) ...")
    started = time.monotonic()
    try:
        with log.open("wb") as log_file:
            proc = subprocess.Popen(
                cmd,
                cwd=module_dir,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            try:
                while True:
                    try:
                        proc.wait(timeout=HEARTBEAT_S)
                        break
                    except subprocess.TimeoutExpired:
                        out(f"  ... still building {name} ({fmt_seconds(time.monotonic() - started)} so far)")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if proc.returncode != 0:
            raise BuildError(
                f"`{' '.join(cmd)}` (in {module_dir}) failed with exit code {proc.returncode}; "
                f"last output ({log}):\n{tail(log)}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    elapsed = time.monotonic() - started
    out(f"built {name} in {fmt_seconds(elapsed)}")
    return elapsed


def ensure_binaries(
    version_key: str | None = None,
    *,
    module_dir: Path = MODULE_DIR,
    root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    out: Printer = print,
) -> BinPaths:
    """Return the cached binaries for ``version_key``, building any that are missing.

    ``version_key`` defaults to the one derived from ``module_dir/go.mod``; pass
    it only to select a cache directory explicitly (the build still uses the
    module's pins).
    """
    env = dict(os.environ if environ is None else environ)
    pins = read_pins(module_dir / "go.mod")
    key = version_key or pins.version_key
    bins = bin_paths(key, root or cache_root(env))
    if not bins.missing():
        return bins
    bins.directory.mkdir(parents=True, exist_ok=True)
    with (bins.directory / ".build.lock").open("w") as lock:
        if not _try_lock(lock.fileno()):
            out(f"another process is building into {bins.directory}; waiting for it ...")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        missing = {p.name for p in bins.missing()}
        if not missing:
            return bins
        go = check_go(env)
        paths = bins.by_name()
        todo = [(name, pkg) for name, pkg in PACKAGES if name in missing]
        out(f"building {len(todo)} binaries for {key} into {bins.directory} (cold builds take minutes each)")
        total = 0.0
        for index, (name, package) in enumerate(todo, start=1):
            out(f"[{index}/{len(todo)}] {name}")
            total += build_one(
                go,
                name,
                package,
                paths[name],
                module_dir=module_dir,
                environ=env,
                out=out,
                linker_flags=ldflags(package, pins),
            )
        out(f"built {len(todo)} binaries in {fmt_seconds(total)}")
    return bins


@dataclasses.dataclass(frozen=True)
class GoBinary:
    """One binary to build from a Go module: file name, package, linker flags, extra environment."""

    name: str
    package: str
    linker_flags: str = "-s -w"
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


def ensure_built(
    directory: Path,
    binaries: Sequence[GoBinary],
    *,
    module_dir: Path,
    environ: Mapping[str, str] | None = None,
    out: Printer = print,
) -> dict[str, Path]:
    """Build whichever of ``binaries`` is missing from the cache ``directory``; return name -> path.

    The generic form of :func:`ensure_binaries` for any Go module pinned in ``module_dir``: each
    binary is built once (:func:`build_one`: temporary file, rename), under an exclusive lock on
    the directory so that two processes never build the same binary at once.
    """
    env = dict(os.environ if environ is None else environ)
    paths = {b.name: directory / b.name for b in binaries}

    def missing() -> list[GoBinary]:
        return [b for b in binaries if not (paths[b.name].is_file() and os.access(paths[b.name], os.X_OK))]

    if not missing():
        return paths
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".build.lock").open("w") as lock:
        if not _try_lock(lock.fileno()):
            out(f"another process is building into {directory}; waiting for it ...")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        todo = missing()
        if not todo:
            return paths
        go = check_go(env)
        out(f"building {len(todo)} binaries into {directory} (a cold build takes minutes)")
        for index, binary in enumerate(todo, start=1):
            out(f"[{index}/{len(todo)}] {binary.name}")
            build_one(
                go,
                binary.name,
                binary.package,
                paths[binary.name],
                module_dir=module_dir,
                environ={**env, **binary.env},
                out=out,
                linker_flags=binary.linker_flags,
            )
    return paths


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
