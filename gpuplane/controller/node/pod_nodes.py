"""What a pod says of where it may run and of what holds it back: read from its spec. Pure.

* :func:`node_filter`: the nodes a pod may use, from its ``nodeSelector`` and required node affinity
  (``matchExpressions`` on labels, ``matchFields`` on ``metadata.name``), as kube-scheduler's
  NodeAffinity reads them;
* :func:`gates_of`: the scheduling gates that keep it from the scheduler.

Steering (which node to write into a gated pod) and the MIG offer (which GPUs a waiting claim's pod may
use, and whether anyone will try the pod at all) read pods with these; both are fed pods a tenant wrote,
so every reader is total or raises ValueError (an operator it cannot read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def gates_of(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of a pod's scheduling gates, in order."""
    return tuple(str(g.get("name", "")) for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def node_filter(pod: Mapping[str, Any]) -> Callable[[str, Mapping[str, str]], bool] | None:
    """A predicate (node name, node labels) -> may the pod go there, from its nodeSelector and required
    node affinity; None when the pod constrains nothing. Raises ValueError on an operator it cannot read."""
    spec = pod.get("spec") or {}
    selector = dict(spec.get("nodeSelector") or {})
    req = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = list(req.get("nodeSelectorTerms") or [])
    if not selector and not terms:
        return None
    for t in terms:
        for e in [*(t.get("matchExpressions") or []), *(t.get("matchFields") or [])]:
            if e.get("operator") not in _OPERATORS:
                raise ValueError(f"node affinity operator {e.get('operator')!r}")

    def allowed(name: str, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in selector.items()):
            return False
        if not terms:
            return True
        fields = {"metadata.name": name}
        return any(
            all(_match(e, labels) for e in t.get("matchExpressions") or [])
            and all(_match(e, fields) for e in t.get("matchFields") or [])
            for t in terms
        )

    return allowed


_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _match(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    have = labels.get(key)
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    try:
        number, bound = int(have or ""), int(values[0])
    except (ValueError, IndexError):
        return False
    return number > bound if op == "Gt" else number < bound
