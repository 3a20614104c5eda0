"""The main job after ``up``: apply every example, wait, show where each pod landed.

``up`` (``e2e.plane.bringup.bring_up``) has installed gpuplane from ``manifests/``
and started the node drivers and the controller (``e2e.plane.components``).
``run(state_dir, kubeconfig)``, after deleting what an earlier run on the same cluster left:

0. the examples that each need the demo's whole GB200 rack (``TAKES_TURNS``:
   the Job, JobSet, LeaderWorkerSet and Workload API gangs, and the IMEX group, which needs a GPU on both
   trays while ``gang-tp8`` holds them all) one after another: apply, wait until
   their pods run, print their lines, delete;
1. ``kubectl apply -f manifests/examples/<scenario>/`` for every other scenario
   folder; folders with a GpuGang first, each waited for until the controller
   has placed its gangs, so that the other examples' pods cannot take the
   NVLink clique a gang needs while the controller is deciding; then the folders
   whose claims pin a GPU by its minor (``mps-tiers``), each waited for until its
   pods run, so that no example that takes any free GPU can take the pinned one
   first (the order of the scheduler's choices then decides nothing);
2. wait until every example pod is Running, or Pending with the scheduler's
   reason (the ``unsatisfiable`` scenario is meant to stay there);
3. print the table (pod, node, device, sharing, CDI ids), one line per gang
   (phase, NVLink domain, member -> node), how each of gpuplane's programs runs (the DaemonSet's and
   the Deployment's pods on the real nodes, host processes for the simulated ones), the fleet map
   (``kubectl gpuplane map``, also written as ``<state>/fleet.html`` and, with Chromium,
   ``<state>/fleet.png``) and how to go on;
4. the verdict (``demo_verdict``): exit 0 only if every example reached the
   state it exists to show, else 1, with each pod that did not, the scheduler's
   reason, its newest Event and what to do next.

``--with-example DIR`` (repeatable) adds a folder of the user's own to the run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import yaml

from e2e.cluster import build
from e2e.cluster import handle as cluster
from e2e.plane import components, demo_verdict, fleetpage, identity, podinstall, report, simnodes
from e2e.plane.realnode import demo_real
from e2e.plane.realnode import plan as realplan
from gpuplane.cli import fleethtml, fleetmap, kubectl_gpuplane

Printer = Callable[[str], None]

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "manifests"
EXAMPLES = MANIFESTS / "examples"
GANG_GROUP, GANG_VERSION, GANG_PLURAL = "gpuplane.dev", "v1alpha1", "gpugangs"
PLACED_PHASES = ("Placed", "Scheduled", "Running")
# Gang examples that each take both GB200 trays of the demo's rack (8 GPUs): shown one at a time, before the rest.
TAKES_TURNS = (
    "gang-indexed-job",
    "gang-jobset",
    "gang-leaderworkerset",
    "gang-workload-api",
    "gang-workload-steered",
    "imex-group",  # one GPU on each tray: it cannot run beside gang-tp8, which holds the whole rack
)


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


def gangs_of(folder: Path) -> list[tuple[str, str]]:
    """(namespace, name) of the GpuGangs in the folder's YAML."""
    found: list[tuple[str, str]] = []
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "GpuGang":
                meta = doc["metadata"]
                found.append((str(meta.get("namespace") or "default"), str(meta["name"])))
    return found


def pins_a_device(folder: Path) -> bool:
    """Whether a claim (or claim template) in the folder selects a GPU by its minor number."""
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            claim = isinstance(doc, dict) and doc.get("kind") in ("ResourceClaim", "ResourceClaimTemplate")
            if claim and ".minor" in json.dumps(doc.get("spec") or {}):
                return True
    return False


def apply_order(folders: Sequence[Path]) -> list[Path]:
    """Gangs first (the controller needs the clique), then examples that pin a GPU, then the rest; by name."""
    return sorted(folders, key=lambda f: (not gangs_of(f), not pins_a_device(f), f.name))


def gang_status(handle: cluster.Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The ``status`` of a GpuGang ({} before the controller wrote one)."""
    obj = cast(
        dict[str, Any],
        handle.custom.get_namespaced_custom_object(GANG_GROUP, GANG_VERSION, namespace, GANG_PLURAL, name),
    )
    return dict(obj.get("status") or {})


def wait_for_gangs(
    handle: cluster.Cluster,
    gangs: Sequence[tuple[str, str]],
    timeout: float,
    out: Printer,
    phases: Sequence[str] = PLACED_PHASES,
) -> None:
    """Wait until every gang is in one of ``phases`` (by default: the controller has placed it)."""
    started = time.monotonic()
    for namespace, name in gangs:
        while True:
            status = gang_status(handle, namespace, name)
            if status.get("phase") in phases:
                out(
                    f"[{time.monotonic() - started:5.1f}s] gang {namespace}/{name}: {status['phase']} "
                    f"in NVLink domain {status.get('domain', '?')}"
                )
                break
            if time.monotonic() - started > timeout:
                raise TimeoutError(
                    f"gang {namespace}/{name} not {'/'.join(phases)} after {timeout:.0f}s: "
                    f"phase {status.get('phase')!r}, {status.get('message', '')} "
                    "(is the controller running? `python -m e2e status`)"
                )
            time.sleep(0.5)


def gang_lines(handle: cluster.Cluster, gangs: Sequence[tuple[str, str]]) -> list[str]:
    """One line per gang: phase, domain, and where each member was placed."""
    lines = []
    for namespace, name in gangs:
        status = gang_status(handle, namespace, name)
        members = (status.get("placement") or {}).get("members") or {}
        where = ", ".join(f"{i}->{members[i]}" for i in sorted(members, key=int))
        lines.append(
            f"gang {namespace}/{name}: {status.get('phase', '?')}, NVLink domain {status.get('domain', '-')}"
            + (f", members {where}" if where else "")
        )
    return lines


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
            out(f"[{now - started:5.1f}s] not settled after {timeout:.0f}s: {', '.join(waiting)} (see the verdict)")
            return pods
        if now - last_note > 10:
            last_note = now
            out(f"[{now - started:5.1f}s] waiting for {len(waiting)} of {len(pods)} pods: {', '.join(waiting[:6])}")
        time.sleep(1.0)


def take_turn(
    handle: cluster.Cluster, folder: Path, state_dir: Path, timeout: float, out: Printer
) -> tuple[list[dict[str, Any]], list[demo_verdict.Finding]]:
    """Apply one rack-sized example, wait until its pods run, print where they are, delete it.

    Returns its pods as they were before the delete (for the verdict) and a finding for a gang that
    did not reach Running.
    """
    out(f"apply (alone: it needs the whole GB200 rack): kubectl apply -f {_shown(folder)}/")
    handle.kubectl("apply", "-f", str(folder))
    namespaces = sorted(namespaces_of(folder))
    found: list[demo_verdict.Finding] = []
    try:
        gangs = gangs_of(folder)
        try:
            if gangs:
                wait_for_gangs(handle, gangs, timeout, out, phases=("Running",))
        except TimeoutError as late:
            found.append(demo_verdict.Finding(folder.name, "", "gang Running", str(late)))
        pods = wait_for_pods(handle, namespaces, timeout, out)
        sim_nodes = {n.name: n for n in simnodes.load_nodes(state_dir)}
        attributes = report.device_attributes(handle.custom)
        for line in report.render_table([report.PodReport.collect(handle.api, p, sim_nodes, attributes) for p in pods]):
            out(line)
        for line in gang_lines(handle, gangs):
            out(line)
        shown = {folder.name: _shown(folder)}
        found += demo_verdict.judge({folder.name: pods}, _events(handle, namespaces), folders=shown)
        return pods, found
    finally:
        handle.kubectl("delete", "-f", str(folder), "--wait=true", "--timeout=120s", timeout=150)


def remove_earlier_run(handle: cluster.Cluster, folders: Sequence[Path], out: Printer) -> None:
    """Delete the examples an earlier demo on this cluster left (they would hold the GPUs this run needs)."""
    existing = set(handle.kubectl("get", "namespaces", "-o", "name").split())
    left = [f for f in folders if any(f"namespace/{ns}" in existing for ns in namespaces_of(f))]
    if not left:
        return
    out(f"removing the examples of an earlier run first: {', '.join(f.name for f in left)}")
    for folder in left:
        handle.kubectl("delete", "-f", str(folder), "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=210)


def _events(handle: cluster.Cluster, namespaces: Sequence[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for namespace in namespaces:
        events.extend(json.loads(handle.kubectl("get", "events", "-n", namespace, "-o", "json")).get("items", []))
    return events


def run(
    state_dir: Path,
    kubeconfig: Path,
    *,
    out: Printer = print,
    timeout: float = 180.0,
    extra_examples: Sequence[Path] = (),
) -> int:
    """Apply the examples (gangs first, then those pinning a GPU), wait, print the table and the verdict.

    Returns 0 when every example reached its expected state (``demo_verdict``), 1 otherwise.
    """
    bins = build.ensure_binaries(out=out)
    handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
    try:
        examples = example_dirs() + [Path(e).resolve() for e in extra_examples]
        remove_earlier_run(handle, examples, out)
        findings: list[demo_verdict.Finding] = []
        for folder in [f for f in examples if f.name in TAKES_TURNS]:
            findings += take_turn(handle, folder, state_dir, timeout, out)[1]
        folders = apply_order([f for f in examples if f.name not in TAKES_TURNS])
        spaces = {f.name: namespaces_of(f) for f in folders}  # each folder's YAML read once
        namespaces: set[str] = set()
        gangs: list[tuple[str, str]] = []
        real = {n.name: n for n in realplan.load(state_dir)}
        sims = simnodes.load_nodes(state_dir)
        with demo_real.placing_on_real_nodes(handle, real, sims, out):
            for folder in folders:
                out(f"apply: kubectl apply -f {_shown(folder)}/")
                handle.kubectl("apply", "-f", str(folder))
                namespaces |= spaces[folder.name]
                placed = gangs_of(folder)
                gangs += placed
                try:
                    wait_for_gangs(handle, placed, timeout, out)
                except TimeoutError as late:
                    findings.append(demo_verdict.Finding(folder.name, "", "gang placed", str(late)))
                if pins_a_device(folder):  # it runs before any example that takes whatever GPU is free
                    wait_for_pods(handle, sorted(spaces[folder.name]), timeout, out)
            out(f"waiting for the pods of {len(folders)} examples (up to {timeout:.0f}s) ...")
            pods = wait_for_pods(handle, sorted(namespaces), timeout, out)
        try:
            wait_for_gangs(handle, gangs, timeout, out, phases=("Running",))  # status follows the pods within seconds
        except TimeoutError as late:
            findings.append(demo_verdict.Finding("gangs", "", "gang Running", str(late)))
        nodes: dict[str, report.NodeFiles] = {n.name: n for n in sims}
        nodes.update(real)
        attributes = report.device_attributes(handle.custom)
        reports = [report.PodReport.collect(handle.api, pod, nodes, attributes) for pod in pods]
        out("")
        for line in report.render_table(reports, real_nodes=set(real)):
            out(line)
        if real:
            out(f"* ran in real containers on a real node ({', '.join(sorted(real))}: kubelet and containerd);")
            out("  what each container saw, read from its own process:")
            for line in demo_real.container_lines(real, pods) or ["  (no example pod was placed on a real node)"]:
                out(line)
        where = "<state>/nodes/<node>/cdi" + (", real nodes' in <state>/realnodes/<node>/cdi" if real else "")
        out(f"(CDI ids shown without their kind, {report.cdi_kind_prefix()}; specs in {where})")
        for line in gang_lines(handle, gangs):
            out(line)
        out("")
        show_components(handle, state_dir, [n.name for n in sims], out)
        out("")
        show_fleet(handle, state_dir, out)
        out("")
        out("Use the cluster:")
        out(f"  export KUBECONFIG={kubeconfig}")
        out(f"  {bins.kubectl} get nodes,resourceslices")
        out(f"  {bins.kubectl} get pods,resourceclaims -A -o wide")
        out(f"  {bins.kubectl} get gpugangs -A")
        out("  kubectl gpuplane map   # the fleet map (.venv/bin/kubectl-gpuplane: put .venv/bin on PATH)")
        out(
            "  python -m gpuplane.driver.hw.sim_cli --state-dir <state>/nodes/<node>/sim show"
            "   # a node's simulated GPUs" + (" (a real node's: <state>/realnodes/<node>/sim)" if real else "")
        )
        if podinstall.recorded(state_dir) is not None:
            out("  kubectl logs -n gpuplane-system deployment/gpuplane-controller   # the controller (a pod)")
            out("  kubectl logs -n gpuplane-system daemonset/gpuplane-driver        # a real node's driver (a pod)")
        out(f"  logs: {state_dir / 'logs'}   (controller-<i>, driver-<node>, kubelet-<node>, the control plane)")
        out(f"  identities: {state_dir / 'identities'}   (ServiceAccount token kubeconfigs, valid 24 h)")
        out("Stop it: scripts/demo.sh down")
        by_example = {f.name: [p for p in pods if p["metadata"]["namespace"] in spaces[f.name]] for f in folders}
        folder_of = {f.name: _shown(f) for f in folders}
        findings += demo_verdict.judge(by_example, _events(handle, sorted(namespaces)), folders=folder_of)
        out("")
        for line in demo_verdict.render(findings, len(examples)):
            out(line)
    finally:
        handle.close()
    return 1 if findings else 0


def show_components(handle: cluster.Cluster, state_dir: Path, sims: Sequence[str], out: Printer) -> None:
    """How gpuplane's programs run here: ``kubectl get pods -n gpuplane-system -o wide`` and a line each."""
    out("gpuplane's programs ($ kubectl get pods -n gpuplane-system -o wide):")
    for line in handle.kubectl("get", "pods", "-n", identity.NAMESPACE, "-o", "wide").splitlines():
        out("  " + line)
    listed = json.loads(handle.kubectl("get", "pods", "-n", identity.NAMESPACE, "-o", "json"))
    real = [n.name for n in realplan.load(state_dir)]
    leader = components.lease_holder(handle.api)
    as_pods = podinstall.recorded(state_dir) is not None
    for line in demo_real.component_lines(listed["items"], real, sims, leader=leader, as_pods=as_pods):
        out(line)


def show_fleet(handle: cluster.Cluster, state_dir: Path, out: Printer) -> None:
    """Print the fleet map (``kubectl gpuplane map``), write it as ``<state>/fleet.html`` and, where Debian's
    Chromium is installed, its screenshot ``<state>/fleet.png``."""
    slices, claims, hidden = kubectl_gpuplane.read(handle.api, "default")
    fleet = fleetmap.build(slices, claims)
    fleet.hidden += hidden
    out("The fleet (kubectl gpuplane map):")
    for line in [*fleetmap.render(fleet), *fleetmap.summary(fleet)]:
        out("  " + line)
    page = state_dir / "fleet.html"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    page.write_text(fleethtml.render(fleet, generated=f"the demo cluster, {now}"))
    browser = shutil.which("chromium")
    if browser is None:
        out(f"  as a page: {page} (no chromium here for a screenshot: scripts/setup-browser.sh)")
        return
    png = state_dir / "fleet.png"
    argv = fleetpage.screenshot_argv(browser, page, png, width=1400, height=1800)
    done = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    shot = f", its screenshot {png}" if done.returncode == 0 and png.is_file() else " (chromium's screenshot failed)"
    out(f"  as a page: {page}{shot}")


def _shown(folder: Path) -> str:
    return str(folder.relative_to(REPO_ROOT)) if folder.is_relative_to(REPO_ROOT) else str(folder)
