"""The main job after ``up``: install gpuplane, apply every example, wait, show where each pod landed.

``run(state_dir, kubeconfig)``:

1. install (``install_mode``): ``classes`` (the default) applies
   ``manifests/deviceclasses``: the harness runs the node drivers itself, one
   process per simulated node. ``kustomize`` runs ``kubectl apply -k manifests/``
   (namespace, CRDs, classes, RBAC, policies, the driver DaemonSet and the
   controller Deployment). That is the hook for the full install: make it the
   default once the controller can run against this cluster; until then note
   that the kubelet stand-in has no container runtime and marks every pod bound
   to its node Running, the controller's and driver's pods included;
2. ``kubectl apply -f manifests/examples/<scenario>/`` for every scenario folder;
3. wait until every example pod is Running, or Pending with the scheduler's
   reason (the ``unsatisfiable`` scenario is meant to stay there);
4. print the table (pod, node, device, sharing, CDI ids) and how to go on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e import build, cluster, report, simnodes

Printer = Callable[[str], None]

REPO_ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = REPO_ROOT / "manifests"
EXAMPLES = MANIFESTS / "examples"
INSTALL_MODES = ("classes", "kustomize")
DEFAULT_INSTALL_MODE = "classes"


def example_dirs(root: Path = EXAMPLES) -> list[Path]:
    """Scenario folders (each with YAML and a README), sorted."""
    return sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*.yaml"))) if root.is_dir() else []


def namespaces_of(folder: Path) -> set[str]:
    """Namespaces the folder's objects live in (their own Namespace objects included)."""
    found: set[str] = set()
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):
                continue
            if doc.get("kind") == "Namespace":
                found.add(str(doc["metadata"]["name"]))
            elif doc.get("metadata", {}).get("namespace"):
                found.add(str(doc["metadata"]["namespace"]))
    return found


def install(handle: cluster.Cluster, out: Printer, mode: str = DEFAULT_INSTALL_MODE) -> None:
    """Install gpuplane's cluster-wide objects (see the module docstring for the modes)."""
    if mode == "kustomize" and (MANIFESTS / "kustomization.yaml").exists():
        out("install: kubectl apply -k manifests/")
        handle.kubectl("apply", "--server-side", "-k", str(MANIFESTS), timeout=120)
        return
    if mode == "kustomize":
        out("install: no manifests/kustomization.yaml; falling back to the DeviceClasses")
    out("install: kubectl apply -f manifests/deviceclasses (node drivers run as harness processes)")
    handle.kubectl("apply", "-f", str(MANIFESTS / "deviceclasses"))


def _pods(handle: cluster.Cluster, namespaces: Sequence[str]) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []
    for namespace in namespaces:
        text = handle.kubectl("get", "pods", "-n", namespace, "-o", "json")
        pods.extend(json.loads(text).get("items", []))
    return pods


def settled(pod: dict[str, Any]) -> bool:
    """Running, or Pending because the scheduler said it cannot place it."""
    status = pod.get("status") or {}
    if status.get("phase") == "Running":
        return True
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def wait_for_pods(
    handle: cluster.Cluster, namespaces: Sequence[str], timeout: float, out: Printer
) -> list[dict[str, Any]]:
    """Wait until every pod in ``namespaces`` has settled; return them."""
    started = time.monotonic()
    last_note = 0.0
    while True:
        pods = _pods(handle, namespaces)
        waiting = [p["metadata"]["namespace"] + "/" + p["metadata"]["name"] for p in pods if not settled(p)]
        if pods and not waiting:
            out(f"[{time.monotonic() - started:5.1f}s] all {len(pods)} example pods settled")
            return pods
        now = time.monotonic()
        if now - started > timeout:
            raise TimeoutError(f"example pods not settled after {timeout:.0f}s: {', '.join(waiting)}")
        if now - last_note > 10:
            last_note = now
            out(f"[{now - started:5.1f}s] waiting for {len(waiting)} of {len(pods)} pods: {', '.join(waiting[:6])}")
        time.sleep(1.0)


def run(
    state_dir: Path,
    kubeconfig: Path,
    *,
    out: Printer = print,
    timeout: float = 180.0,
    install_mode: str = DEFAULT_INSTALL_MODE,
) -> int:
    """Install, apply the examples, wait, print the table."""
    bins = build.ensure_binaries(out=out)
    handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
    try:
        install(handle, out, install_mode)
        folders = example_dirs()
        namespaces: set[str] = set()
        for folder in folders:
            out(f"apply: kubectl apply -f {folder.relative_to(REPO_ROOT)}/")
            handle.kubectl("apply", "-f", str(folder))
            namespaces |= namespaces_of(folder)
        out(f"waiting for the pods of {len(folders)} examples (up to {timeout:.0f}s) ...")
        pods = wait_for_pods(handle, sorted(namespaces), timeout, out)
        sim_nodes = {n.name: n for n in simnodes.load_nodes(state_dir)}
        attributes = report.device_attributes(handle.custom)
        reports = [report.PodReport.collect(handle.api, pod, sim_nodes, attributes) for pod in pods]
        out("")
        for line in report.render_table(reports):
            out(line)
        out(f"(CDI ids shown without their kind, {report.cdi_kind_prefix()}; specs in <state>/nodes/<node>/cdi)")
        out("")
        out("Use the cluster:")
        out(f"  export KUBECONFIG={kubeconfig}")
        out(f"  {bins.kubectl} get nodes,resourceslices")
        out(f"  {bins.kubectl} get pods,resourceclaims -A -o wide")
        out("  python -m driver.hw.sim_cli --state-dir <state>/nodes/<node>/sim show   # a node's simulated GPUs")
        out(f"  logs: {state_dir / 'logs'}")
        out("Stop it: scripts/demo.sh down")
    finally:
        handle.close()
    return 0
