"""The demo and real nodes: examples placed on them, and what their containers saw.

``placing_on_real_nodes`` cordons the simulated nodes of the real nodes' hardware
profiles while the examples are applied and placed (the examples stay as
written: the real scheduler then finds only the real node of that profile, and
the simulated nodes of other profiles), and uncordons them afterwards.
``container_lines`` gives, for every pod bound to a real node, one line per
container that uses a claim: what that container's own process sees
(``e2e.plane.realnode.inspect``): its ``NVIDIA_VISIBLE_DEVICES``, its NVIDIA
device nodes, and whether it has an MPS pipe directory.
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
