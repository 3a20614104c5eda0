"""When is a real node usable: its Node Ready (by kubelet's own report), its driver registered, its slices out.

Each check returns ``None`` when satisfied, or a short reason to show while
waiting. ``wait_all`` polls a check over several nodes with progress lines,
fails early when one of the node's processes has died, and returns the seconds
each node took.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from kubernetes import client

from gpuplane.api import names

Printer = Callable[[str], None]
Check = Callable[[str], "str | None"]

REGISTERED_EVENT = '"kubelet registered the plugin"'
PROGRESS_EVERY_S = 15.0


def node_problem(api: client.ApiClient, name: str) -> str | None:
    """Why Node ``name`` is not Ready and untainted yet, or None."""
    try:
        obj = client.CoreV1Api(api).read_node(name)
    except client.ApiException as err:
        return "no Node object yet (kubelet starting)" if err.status == 404 else f"API error {err.status}"
    conditions = {c.type: c for c in ((obj.status.conditions if obj.status else None) or [])}
    ready = conditions.get("Ready")
    if ready is None:
        return "no Ready condition yet"
    if ready.status != "True":
        return f"NotReady ({ready.reason}: {(ready.message or '')[:160]})"
    taints = [t.key for t in ((obj.spec.taints if obj.spec else None) or [])]
    return f"taints {taints}" if taints else None


def kubelet_version(api: client.ApiClient, name: str) -> str:
    """The kubelet version Node ``name`` reports (``status.nodeInfo.kubeletVersion``; "" when unknown)."""
    try:
        obj = client.CoreV1Api(api).read_node(name)
    except client.ApiException:
        return ""
    info = obj.status.node_info if obj.status else None
    return str(info.kubelet_version) if info is not None else ""


def pool_problem(api: client.ApiClient, name: str) -> str | None:
    """Why the driver's ResourceSlice pool of node ``name`` is not complete yet, or None."""
    listed = cast(
        dict[str, Any],
        client.CustomObjectsApi(api).list_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={name}"
        ),
    )
    pool = [s for s in listed.get("items", []) if s["spec"]["driver"] == names.DRIVER_NAME]
    if not pool:
        return "no ResourceSlices yet"
    generation = max(int(s["spec"]["pool"]["generation"]) for s in pool)
    current = [s for s in pool if int(s["spec"]["pool"]["generation"]) == generation]
    expected = int(current[0]["spec"]["pool"]["resourceSliceCount"])
    return None if len(current) >= expected else f"{len(current)}/{expected} ResourceSlices"


def registrations(driver_log: Path) -> int:
    """How often the driver's log says kubelet registered it (NotifyRegistrationStatus true); restarts append."""
    try:
        return driver_log.read_text(errors="replace").count(REGISTERED_EVENT)
    except OSError:
        return 0


def registered(driver_log: Path) -> bool:
    """Whether kubelet has registered the driver at least once."""
    return registrations(driver_log) > 0


def wait_all(
    names_: Sequence[str],
    check: Check,
    what: str,
    *,
    began: float,
    timeout: float,
    alive: Callable[[str], None],
    out: Printer,
    on_timeout: Callable[[str, str], BaseException],
) -> Mapping[str, float]:
    """Poll ``check`` for every node until all pass; return node -> seconds since ``began``."""
    pending = list(names_)
    problems: dict[str, str] = {}
    done: dict[str, float] = {}
    last_note = time.monotonic()
    while pending:
        for name in list(pending):
            alive(name)
            found = check(name)
            if found is None:
                pending.remove(name)
                done[name] = time.monotonic() - began
                out(f"[{done[name]:5.1f}s] node {name}: {what}")
            else:
                problems[name] = found
        if not pending:
            break
        now = time.monotonic()
        detail = "; ".join(f"{n} ({problems.get(n, '?')})" for n in pending)
        if now - began > timeout:
            raise on_timeout(pending[0], f"not {what} after {timeout:.0f}s: {detail}")
        if now - last_note > PROGRESS_EVERY_S:
            last_note = now
            out(f"[{now - began:5.1f}s]   waiting for {len(pending)} node(s): {detail}")
        time.sleep(0.25)
    return done
