"""The demo and real nodes: examples placed on them, and what their containers saw.

``placing_on_real_nodes`` cordons the simulated nodes of the real nodes' hardware
profiles while the examples are applied and placed (the examples stay as
written: the real scheduler then finds only the real node of that profile, and
the simulated nodes of other profiles), and uncordons them afterwards.
``container_lines`` gives, for every pod bound to a real node, one line per
container that uses a claim: what that container's own process sees
(``e2e.plane.realnode.inspect``): its ``NVIDIA_VISIBLE_DEVICES``, its NVIDIA
device nodes, and whether it has an MPS pipe directory. ``component_lines`` says how each of
gpuplane's programs runs in this cluster: the DaemonSet's and the Deployment's pods on the real nodes
(``e2e.plane.podinstall``), host processes for the simulated nodes, which cannot run containers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from e2e.cluster import handle as cluster
from e2e.plane import simnodes
from e2e.plane.realnode import inspect
from e2e.plane.realnode.plan import RealNode

Printer = Callable[[str], None]


@contextlib.contextmanager
def placing_on_real_nodes(
    handle: cluster.Cluster, real: Mapping[str, RealNode], sims: Sequence[simnodes.SimNode], out: Printer
) -> Iterator[None]:
    """Cordon the simulated nodes of the real nodes' profiles for the duration of the block."""
    profiles = {n.profile for n in real.values()}
    cordoned = [n.name for n in sims if n.profile in profiles]
    if not cordoned:
        yield
        return
    out(
        f"real nodes: cordoning the simulated {', '.join(sorted(profiles))} node(s) {', '.join(cordoned)} while the "
        f"examples are placed, so that those needing a {'/'.join(sorted(profiles))} run in real containers"
    )
    for name in cordoned:
        handle.kubectl("cordon", name)
    try:
        yield
    finally:
        for name in cordoned:
            handle.kubectl("uncordon", name, check=False)


def container_lines(nodes: Mapping[str, RealNode], pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """``<ns>/<pod>/<container> on <node>: NVIDIA_VISIBLE_DEVICES=... dev=...`` for each pod on a real node."""
    lines = []
    for pod in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
        node = nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
        if node is None or (pod.get("status") or {}).get("phase") != "Running":
            continue
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        for container in pod["spec"]["containers"]:
            if not (container.get("resources") or {}).get("claims"):
                continue
            try:
                seen = inspect.view(node, pod, container["name"]).line()
            except inspect.NotRunning as err:
                seen = f"(not readable: {err})"
            lines.append(f"  {key}/{container['name']} on {node.name}: {seen}")
    return lines


def _image(pod: Mapping[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def _state(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    ready = all(c.get("ready") for c in status.get("containerStatuses") or [{}])
    return f"{status.get('phase', '?')}{'' if ready else ', not ready'}"


def component_lines(
    pods: Sequence[Mapping[str, Any]], real: Sequence[str], sims: Sequence[str], *, leader: str, as_pods: bool
) -> list[str]:
    """Which of gpuplane's programs run as pods (on which node, from which image) and which as host processes.

    ``pods``: the pods of ``gpuplane-system``; ``real``/``sims``: the node names; ``leader``: the controller
    Lease's holder; ``as_pods``: gpuplane was installed as pods (``podinstall``), else its controllers are
    host processes too.
    """

    def named(prefix: str) -> list[Mapping[str, Any]]:
        return sorted(
            (p for p in pods if str(p["metadata"].get("generateName", "")).startswith(prefix)),
            key=lambda p: str(p["metadata"]["name"]),
        )

    lines = []
    drivers = {
        str(p["spec"].get("nodeName")): p for p in named("gpuplane-driver-") if "identity" not in p["metadata"]["name"]
    }
    for node in real:
        pod = drivers.get(node)
        what = (
            f"pod {pod['metadata']['name']} of DaemonSet gpuplane-driver, image {_image(pod)}, {_state(pod)}"
            if pod
            else "no driver pod (see `kubectl describe daemonset -n gpuplane-system gpuplane-driver`)"
        )
        lines.append(f"  {node} (real node, kubelet + containerd): driver = {what}")
    if sims:
        lines.append(
            f"  {', '.join(sims)} (simulated, no container runtime): driver = host process driver-<node> "
            "as ServiceAccount gpuplane-driver (token bound to pod gpuplane-driver-identity-<node>)"
        )
    if as_pods:
        for pod in named("gpuplane-controller-"):
            role = "leader" if pod["metadata"]["name"] == leader else "standby"
            lines.append(
                f"  controller = pod {pod['metadata']['name']} of Deployment gpuplane-controller on "
                f"{pod['spec'].get('nodeName') or '(unscheduled)'}, image {_image(pod)}, {_state(pod)}, {role}"
            )
    else:
        lines.append(f"  controller = host processes controller-<i> (no real node to run pods on); leader {leader}")
    return lines
