"""Gate-and-steer, the pod side: which pods are held by a gate, and the one JSON patch that steers or releases.

A pod created with a scheduling gate is invisible to the scheduler until the
gate goes. While gated, its node affinity may change (Kubernetes allows
narrowing the required terms and any change to the preferred ones), so a
controller can choose the node, write it into the affinity and lift the gate
in one patch; the scheduler (and its DRA allocator) then does the rest.

Two ways to write the choice:

* ``prefer``: a preferred node-affinity term of weight 100 for the node. The
  scheduler's NodeAffinity score (weight 2 in the default profile, 200 points
  for the node against a few points of LeastAllocated) makes it win whenever it
  fits; if it no longer fits when the scheduler looks, the pod still schedules
  elsewhere instead of waiting. The default for single pods.
* ``require``: every required node-selector term narrowed to the node (what
  gangs need: all-or-nothing in one NVLink domain). A pod cannot be widened
  again once its gate is gone.

Every patch starts with a JSON-patch ``test`` of the gate list as read, so a
concurrent change (another controller lifting its own gate) makes it fail
instead of being overwritten. Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gpuplane.controller.indexed import PodView

HOSTNAME_LABEL = "kubernetes.io/hostname"
PREFERRED_WEIGHT = 100

Mode = Literal["prefer", "require"]


def held_by(pod: PodView, gate: str) -> bool:
    """Whether ``pod`` is unbound and carries ``gate``."""
    return gate in pod.gates and not pod.node_name


def _host_expr(node: str) -> dict[str, Any]:
    return {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}


def steered_affinity(affinity: Mapping[str, Any] | None, node: str, mode: Mode) -> dict[str, Any]:
    """``affinity`` with ``node`` written in: a preferred term (``prefer``) or every required term narrowed."""
    aff = dict(affinity or {})
    na = dict(aff.get("nodeAffinity") or {})
    if mode == "prefer":
        pref = [dict(t) for t in na.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
        term = {"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": [_host_expr(node)]}}
        if term not in pref:
            pref.append(term)
        na["preferredDuringSchedulingIgnoredDuringExecution"] = pref
    else:
        req = dict(na.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = [dict(t) for t in req.get("nodeSelectorTerms") or []] or [{}]
        for t in terms:
            exprs = list(t.get("matchExpressions") or [])
            if _host_expr(node) not in exprs:
                exprs.append(_host_expr(node))
            t["matchExpressions"] = exprs
        req["nodeSelectorTerms"] = terms
        na["requiredDuringSchedulingIgnoredDuringExecution"] = req
    aff["nodeAffinity"] = na
    return aff


def _gate_ops(gates: Sequence[str], gate: str) -> list[dict[str, Any]]:
    remaining = [{"name": g} for g in gates if g != gate]
    return [
        {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": g} for g in gates]},
        {"op": "replace", "path": "/spec/schedulingGates", "value": remaining},
    ]


def steer_patch(pod: PodView, node: str, mode: Mode, gate: str) -> list[dict[str, Any]]:
    """One JSON patch: write ``node`` into the affinity and lift ``gate`` (other gates stay)."""
    aff = steered_affinity(pod.affinity, node, mode)
    return [*_gate_ops(pod.gates, gate), {"op": "add", "path": "/spec/affinity", "value": aff}]


def release_patch(pod: PodView, gate: str) -> list[dict[str, Any]]:
    """One JSON patch that lifts ``gate`` and changes nothing else (fail-open: the scheduler decides)."""
    return _gate_ops(pod.gates, gate)


def annotation_ops(had: Mapping[str, Any] | None, mine: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """JSON-patch operations on gpuplane's own annotation keys only (``None``: remove it if there).

    Never the whole map: rewriting it carried every annotation of the pod in the patch (a pod with
    250 KiB of its owner's annotations made every steering write fail), and a key written by someone
    else between the read and the write would have been undone. ``had`` is the pod's map as indexed
    (gpuplane's keys only, but present whenever the pod has any annotation); ``None`` when the pod has
    none, the one case where the map itself is added.
    """
    if had is None:
        value = {k: v for k, v in mine.items() if v is not None}
        return [{"op": "add", "path": "/metadata/annotations", "value": value}] if value else []
    ops: list[dict[str, Any]] = []
    for key, v in mine.items():
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        if v is not None:
            ops.append({"op": "add", "path": path, "value": v})
        elif key in had:
            ops.append({"op": "remove", "path": path})
    return ops


def pinned_node(pod: PodView) -> str | None:
    """The single node a pod's required affinity or nodeSelector already allows, if exactly one; else None."""
    sel = pod.node_selector.get(HOSTNAME_LABEL)
    if sel:
        return str(sel)
    req = ((pod.affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    nodes: set[str] = set()
    for t in req.get("nodeSelectorTerms") or []:
        for e in t.get("matchExpressions") or []:
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In" and len(e.get("values") or []) == 1:
                nodes.add(str(e["values"][0]))
    return nodes.pop() if len(nodes) == 1 else None
