"""Helm, built from its Go module and cached by version like the Kubernetes binaries.

``ensure_helm()`` returns ``<cache>/helm/<version>-r<recipe>/helm``, building it
once with ``go install helm.sh/helm/v3/cmd/helm@<version>`` (the module has no
replace directives, so ``go install`` builds it as released), stamped with its
version as helm's own Makefile does (``helm version`` reports it). ``template``
and ``lint`` run ``helm template`` / ``helm lint`` on a chart and return what
they printed; ``render`` parses a template into objects.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import build
from e2e.images import steps

Printer = Callable[[str], None]

HELM_MODULE = "helm.sh/helm/v3"
HELM_VERSION = "v3.22.0"
# The Kubernetes minor of the client-go that helm v3.22 is built with (its go.mod): what
# `.Capabilities.KubeVersion` reports offline, as helm's Makefile stamps it.
HELM_KUBE_MINOR = "37"
# r1: version, tree state and Kubernetes version stamped.
RECIPE_REVISION = 1
REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuplane"


class HelmError(RuntimeError):
    """helm could not be built, or a helm command failed; the message has its output."""


def ldflags(version: str = HELM_VERSION) -> str:
    """Linker flags helm's Makefile uses for a release build."""
    pkg = f"{HELM_MODULE}"
    return " ".join(
        [
            "-s",
            "-w",
            f"-X {pkg}/internal/version.version={version}",
            f"-X {pkg}/internal/version.gitTreeState=clean",
            f"-X {pkg}/pkg/chartutil.k8sVersionMajor=1",
            f"-X {pkg}/pkg/chartutil.k8sVersionMinor={HELM_KUBE_MINOR}",
            f"-X {pkg}/pkg/lint/rules.k8sVersionMajor=1",
            f"-X {pkg}/pkg/lint/rules.k8sVersionMinor={HELM_KUBE_MINOR}",
        ]
    )


def helm_path(root: Path, version: str = HELM_VERSION) -> Path:
    """Where the cached helm of ``version`` is (existing or not)."""
    return root / "helm" / f"{version}-r{RECIPE_REVISION}" / "helm"


def ensure_helm(
    *,
    version: str = HELM_VERSION,
    root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    out: Printer = print,
) -> Path:
    """The cached helm binary, built from the Go module proxy when missing."""
    env = dict(os.environ if environ is None else environ)
    dest = helm_path(root or build.cache_root(env), version)
    if dest.is_file() and os.access(dest, os.X_OK):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (dest.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if dest.is_file():
            return dest
        go = build.check_go(env)
        with tempfile.TemporaryDirectory(prefix="helm-", dir=dest.parent) as gobin:
            env_build = {**env, "GOBIN": gobin, "GOFLAGS": "", "CGO_ENABLED": "0"}
            out(f"building helm {version} from {HELM_MODULE} (go install; a few minutes the first time)")
            seconds = steps.run(
                [go, "install", "-trimpath", f"-ldflags={ldflags(version)}", f"{HELM_MODULE}/cmd/helm@{version}"],
                label="helm",
                log=dest.parent / "build.log",
                out=out,
                env=env_build,
                hint="the Go module proxy must be reachable (GOPROXY) for the first build",
            )
            os.replace(Path(gobin) / "helm", dest)
        out(f"built helm {version} in {steps.fmt_seconds(seconds)} ({dest})")
    return dest


def run(helm: Path, *args: str, timeout: float = 120) -> str:
    """``helm ARGS``; its stdout, or HelmError with its stderr."""
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise HelmError(f"`helm {' '.join(args)}` failed ({proc.returncode}):\n{proc.stderr.strip()}")
    return proc.stdout


def template(
    helm: Path,
    chart: Path = CHART,
    *,
    release: str = "gpuplane",
    namespace: str = "gpuplane-system",
    values: Sequence[Path] = (),
    set_values: Sequence[str] = (),
) -> str:
    """``helm template RELEASE CHART`` (CRDs included) with values files and ``--set`` pairs."""
    args = ["template", release, str(chart), "--namespace", namespace, "--include-crds"]
    for path in values:
        args += ["--values", str(path)]
    for pair in set_values:
        args += ["--set", pair]
    return run(helm, *args)


def render(helm: Path, chart: Path = CHART, **kwargs: Any) -> list[dict[str, Any]]:
    """The objects ``template`` renders."""
    return [doc for doc in yaml.safe_load_all(template(helm, chart, **kwargs)) if doc]


def lint(helm: Path, chart: Path = CHART, *, strict: bool = True) -> str:
    """``helm lint [--strict] CHART``; its output (HelmError when it finds an error)."""
    return run(helm, "lint", *(["--strict"] if strict else []), str(chart))
