"""A newer kube-scheduler than the cluster's, built once from ``e2e/cluster/schedbuild`` into the cache.

The fleet benchmark (``--newer-scheduler build``) swaps it in for the cluster's kube-scheduler to
measure a newer release's DRA allocator on the same fleet, in the same run. kube-scheduler 1.37
keeps a node's counter slices to that node (kubernetes/kubernetes#138917); 1.36 treats every slice
with ``sharedCounters`` as relevant to every node, so each node's Filter rebuilds every other node's
pool (``docs/benchmarks.md``, "Fleet scale").

The binary is stamped with its release like the cluster's (``e2e.cluster.build.ldflags``) and cached
under ``<cache>/sched/<release>-r<recipe>/``; a version skew note: a scheduler newer than the API
server is outside Kubernetes' supported skew, which is why this is a benchmark tool only.
"""

from __future__ import annotations

import os
from pathlib import Path

from e2e.cluster import build

MODULE_DIR = Path(__file__).resolve().parents[2] / "e2e" / "cluster" / "schedbuild"
PACKAGE = "k8s.io/kubernetes/cmd/kube-scheduler"


def release(go_mod: Path = MODULE_DIR / "go.mod") -> str:
    """The ``k8s.io/kubernetes`` release ``go_mod`` requires, e.g. ``v1.37.2``."""
    return build.required_version(go_mod, build.KUBERNETES_MODULE)


def ensure(out: build.Printer = print) -> Path:
    """The newer kube-scheduler's path, building it first when the cache lacks it (minutes, cold)."""
    version = release()
    pins = build.ModulePins(kubernetes=version, etcd="", go="")
    directory = build.cache_root(os.environ) / "sched" / f"{version}-r{build.RECIPE_REVISION}"
    binary = build.GoBinary("kube-scheduler", PACKAGE, linker_flags=build.ldflags(PACKAGE, pins))
    return build.ensure_built(directory, [binary], module_dir=MODULE_DIR, out=out)["kube-scheduler"]
