"""``kubectl gpuplane why``: why a pod or claim waits, or what it got, in one place. Pure: API dicts in, lines out.

It gathers what three components said, each where it says it:

- **the controller**: on the claim, ``gpuplane.dev/unallocated-reason`` (why nothing can allocate it
  now), ``gpuplane.dev/config-error`` (a configuration nothing will prepare) and
  ``gpuplane.dev/nvlink-constraint-warning``; its Events;
- **kube-scheduler**: the pod's ``PodScheduled`` condition (``Unschedulable`` and its message);
- **the node's driver and kubelet**: ``FailedPrepareDynamicResources`` Events on the pod, and the claim's
  ``status.devices`` (what the container got: UUID, sharing).

The annotation keys are the controller's (``gpuplane.controller.names``); this package may not import
it, so they are spelled here and a unit test holds the two equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuplane.api.boundedjson import mapping

UNALLOCATED = "gpuplane.dev/unallocated-reason"
CONFIG_ERROR = "gpuplane.dev/config-error"
NVLINK_WARNING = "gpuplane.dev/nvlink-constraint-warning"
DRIVER = "gpu.gpuplane.dev"


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _key(obj: Mapping[str, Any]) -> str:
    meta = mapping(obj.get("metadata"))
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"


def claim_lines(claim: Mapping[str, Any]) -> list[str]:
    """What the claim has (allocation, devices) or why it waits (the controller's annotations)."""
    notes = mapping(mapping(claim.get("metadata")).get("annotations"))
    status = mapping(claim.get("status"))
    results = [mapping(r) for r in _l(mapping(mapping(status.get("allocation")).get("devices")).get("results"))]
    lines = [f"claim {_key(claim)}:"]
    if results:
        where = ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in results)
        users = ", ".join(str(mapping(u).get("name")) for u in _l(status.get("reservedFor"))) or "no pod yet"
        lines.append(f"  allocated: {where} (reserved for: {users})")
    else:
        lines.append("  not allocated")
    for key, label in ((UNALLOCATED, "controller"), (CONFIG_ERROR, "configuration"), (NVLINK_WARNING, "NVLink")):
        if notes.get(key):
            lines.append(f"  {label}: {notes[key]}")
    for device in map(mapping, _l(status.get("devices"))):
        if device.get("driver") != DRIVER:
            continue
        data = mapping(device.get("data"))
        sharing = mapping(data.get("sharing"))
        lines.append(
            f"  got {device.get('device')}: {data.get('kind', '?')} {data.get('uuid', '?')}, "
            f"{sharing.get('strategy', '?')}"
            + "".join(f", {k} {v}" for k, v in sorted(sharing.items()) if k != "strategy")
        )
    return lines


def pod_lines(pod: Mapping[str, Any]) -> list[str]:
    """The pod's phase, node and what kube-scheduler said."""
    status = mapping(pod.get("status"))
    node = mapping(pod.get("spec")).get("nodeName") or "no node yet"
    lines = [f"pod {_key(pod)}: {status.get('phase', '?')} on {node}"]
    for cond in map(mapping, _l(status.get("conditions"))):
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            lines.append(f"  kube-scheduler: {cond.get('reason', '?')}: {cond.get('message', '')}".rstrip())
    gates = [str(mapping(g).get("name")) for g in _l(mapping(pod.get("spec")).get("schedulingGates"))]
    if gates:
        lines.append(
            f"  held by scheduling gates: {', '.join(gates)} (gpuplane's gates lift when the controller decides)"
        )
    return lines


def event_lines(events: Iterable[Mapping[str, Any]], limit: int = 12) -> list[str]:
    """The newest ``limit`` Events, oldest first, one line each."""

    def when(e: Mapping[str, Any]) -> str:
        return str(
            e.get("lastTimestamp") or e.get("eventTime") or mapping(e.get("metadata")).get("creationTimestamp") or ""
        )

    chosen = sorted(events, key=when)[-limit:]
    out = []
    for e in chosen:
        obj = mapping(e.get("involvedObject"))
        count = f" x{e['count']}" if isinstance(e.get("count"), int) and e["count"] > 1 else ""
        out.append(
            f"  {when(e)} {e.get('type', '?')} {e.get('reason', '?')}{count} "
            f"{str(obj.get('kind', '?')).lower()}/{obj.get('name', '?')}: {e.get('message', '')}"
        )
    return out


def verdict(
    claims: Sequence[Mapping[str, Any]], pod: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]]
) -> str:
    """One line: where to look first."""
    for claim in claims:
        notes = mapping(mapping(claim.get("metadata")).get("annotations"))
        if notes.get(CONFIG_ERROR):
            return f"fix the claim's configuration: {notes[CONFIG_ERROR]}"
    failed = [e for e in events if e.get("reason") == "FailedPrepareDynamicResources"]
    if failed:
        return f"the node's driver refused to prepare a claim: {failed[-1].get('message', '')}"
    pending = [c for c in claims if not mapping(mapping(c.get("status")).get("allocation"))]
    for claim in pending:
        notes = mapping(mapping(claim.get("metadata")).get("annotations"))
        if notes.get(UNALLOCATED):
            return f"no device fits the claim now: {notes[UNALLOCATED]}"
    if pod is not None:
        for cond in map(mapping, _l(mapping(pod.get("status")).get("conditions"))):
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return f"kube-scheduler cannot place the pod: {cond.get('message', '')}"
        if mapping(pod.get("status")).get("phase") == "Running":
            return "running: every claim was allocated and prepared"
    if pending:
        return "waiting for kube-scheduler to allocate the claim (no explanation recorded yet)"
    return "allocated; waiting for a pod or for the node to prepare it"


def render(
    claims: Sequence[Mapping[str, Any]], pod: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The whole answer."""
    lines = [f"why: {verdict(claims, pod, events)}"]
    if pod is not None:
        lines += pod_lines(pod)
    for claim in claims:
        lines += claim_lines(claim)
    if events:
        lines += ["events:", *event_lines(events)]
    return lines
