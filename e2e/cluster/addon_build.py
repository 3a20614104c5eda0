"""Build workload controllers (JobSet, LeaderWorkerSet) from their Go modules, once, into a cache.

Each add-on has a Go module of its own under ``e2e/cluster/addonbuild/<name>``
that requires exactly one release (JobSet and LeaderWorkerSet bring their own
controller-runtime and Kubernetes client versions, so they are kept apart from
each other and from ``e2e/cluster/k8sbuild``). The cache directory
``<cache>/addons/<name>-<version>-r<RECIPE_REVISION>/`` holds the controller
binary, stamped with its release as upstream's Makefile does, and the
manifests the controller needs, copied from the same module version: its CRDs,
its ClusterRole, its webhook configurations and the kustomize patches that
narrow them. A half-written binary is never cached (``build.build_one`` writes
a temporary file and renames it); the manifests are copied before the binary,
so a directory with a binary is complete. An exclusive lock keeps two
processes from building the same add-on at once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from e2e.cluster import build

ADDON_DIR = Path(__file__).resolve().parent / "addonbuild"
# r1: first recipe (binary stamped through <module>/pkg/version; manifests copied beside it).
RECIPE_REVISION = 1
BINARY = "manager"
MANIFESTS = "manifests"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to build one add-on and which of its module's files to keep."""

    name: str
    module: str
    package: str  # the main package
    crds: tuple[str, ...]  # module-relative paths
    role: str  # the ClusterRole the manager runs under
    webhooks: str  # MutatingWebhookConfiguration and ValidatingWebhookConfiguration
    webhook_patches: Mapping[str, str]  # webhook configuration kind -> JSON-patch file (kustomize's)
    config_api: str  # apiVersion of the manager's --config file

    @property
    def module_dir(self) -> Path:
        """The pinning Go module in this repository."""
        return ADDON_DIR / self.name

    @property
    def version_package(self) -> str:
        """Where the release string is stamped (``GitVersion``, ``GitCommit``)."""
        return f"{self.module}/pkg/version"


JOBSET = Recipe(
    name="jobset",
    module="sigs.k8s.io/jobset",
    package="sigs.k8s.io/jobset",
    crds=("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
    role="config/components/rbac/role.yaml",
    webhooks="config/components/webhook/manifests.yaml",
    webhook_patches={
        "MutatingWebhookConfiguration": "config/components/webhook/patches/mutating-patch.yaml",
        "ValidatingWebhookConfiguration": "config/components/webhook/patches/validating-patch.yaml",
    },
    config_api="config.jobset.x-k8s.io/v1alpha1",
)
LWS = Recipe(
    name="lws",
    module="sigs.k8s.io/lws",
    package="sigs.k8s.io/lws/cmd",
    crds=(
        "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
        "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
    ),
    role="config/rbac/role.yaml",
    webhooks="config/webhook/manifests.yaml",
    webhook_patches={
        "MutatingWebhookConfiguration": "config/webhook/mutating-patch.yaml",
        "ValidatingWebhookConfiguration": "config/webhook/validating-patch.yaml",
    },
    config_api="config.lws.x-k8s.io/v1alpha1",
)
RECIPES: Mapping[str, Recipe] = {r.name: r for r in (JOBSET, LWS)}


@dataclasses.dataclass(frozen=True)
class Built:
    """A cached add-on: its binary and the manifests of the same release."""

    recipe: Recipe
    version: str
    directory: Path

    @property
    def binary(self) -> Path:
        """The manager binary."""
        return self.directory / BINARY

    def manifest(self, module_path: str) -> Path:
        """The cached copy of a module file (same relative path)."""
        return self.directory / MANIFESTS / module_path

    @property
    def crds(self) -> tuple[Path, ...]:
        """CustomResourceDefinition files."""
        return tuple(self.manifest(p) for p in self.recipe.crds)

    def complete(self) -> bool:
        """The binary is executable and every manifest is there."""
        files = [self.recipe.role, self.recipe.webhooks, *self.recipe.crds, *self.recipe.webhook_patches.values()]
        return (
            self.binary.is_file() and os.access(self.binary, os.X_OK) and all(self.manifest(p).is_file() for p in files)
        )


def recipe(name: str) -> Recipe:
    """The recipe called ``name``; ValueError names the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown add-on {name!r}; known: {', '.join(RECIPES)}") from None


def pinned_version(r: Recipe) -> str:
    """The release ``r``'s module requires in its go.mod."""
    text = (r.module_dir / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(r.module)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise build.BuildError(f"{r.module_dir / 'go.mod'} does not require {r.module}")
    return match.group(1)


def cache_dir(r: Recipe, version: str, root: Path) -> Path:
    """``<root>/addons/<name>-<version>-r<revision>``."""
    return root / "addons" / f"{r.name}-{version}-r{RECIPE_REVISION}"


def _module_source(go: str, r: Recipe, version: str, env: Mapping[str, str]) -> tuple[Path, str]:
    """The module's directory in the Go module cache (downloaded if needed) and its commit."""
    done = subprocess.run(
        [go, "mod", "download", "-json", f"{r.module}@{version}"],
        cwd=r.module_dir,
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        info = json.loads(done.stdout or "{}")
    except ValueError:
        info = {}
    if done.returncode != 0 or not info.get("Dir"):
        why = info.get("Error") or done.stderr.strip() or f"exit code {done.returncode}"
        raise build.BuildError(
            f"`go mod download {r.module}@{version}` failed: {why}. The Go module proxy must serve this exact "
            f"version (GOPROXY={env.get('GOPROXY', 'default')}); pin another in {r.module_dir / 'go.mod'}"
        )
    commit = str((info.get("Origin") or {}).get("Hash") or "")
    return Path(info["Dir"]), commit


def _copy_manifests(r: Recipe, source: Path, dest: Path) -> None:
    for rel in (r.role, r.webhooks, *r.crds, *r.webhook_patches.values()):
        src = source / rel
        if not src.is_file():
            raise build.BuildError(f"{r.module} has no {rel} (the recipe in {__file__} needs updating)")
        target = dest / MANIFESTS / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        shutil.copyfile(src, tmp)
        os.replace(tmp, target)


def ensure_addon(
    name: str,
    *,
    root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    out: build.Printer = print,
) -> Built:
    """Return the cached add-on ``name``, building it (and copying its manifests) when missing."""
    r = recipe(name)
    env = dict(os.environ if environ is None else environ)
    version = pinned_version(r)
    built = Built(r, version, cache_dir(r, version, root or build.cache_root(env)))
    if built.complete():
        return built
    built.directory.mkdir(parents=True, exist_ok=True)
    with (built.directory / ".build.lock").open("w") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out(f"another process is building {name} into {built.directory}; waiting for it ...")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if built.complete():
            return built
        go = build.check_go(env)
        out(f"building {name} {version} ({r.module}) into {built.directory} (a cold build takes minutes)")
        source, commit = _module_source(go, r, version, env)
        _copy_manifests(r, source, built.directory)
        flags = f"-s -w -X {r.version_package}.GitVersion={version}"
        if commit:
            flags += f" -X {r.version_package}.GitCommit={commit}"
        build.build_one(
            go, name, r.package, built.binary, module_dir=r.module_dir, environ=env, out=out, linker_flags=flags
        )
    return built
