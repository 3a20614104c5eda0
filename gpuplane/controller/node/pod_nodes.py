"""Where a pending pod may run: :func:`node_filter`, from its ``nodeSelector`` and required node affinity
(``matchExpressions`` on labels, ``matchFields`` on ``metadata.name``), as kube-scheduler's NodeAffinity
reads them. Pure. (Its gates are :attr:`gpuplane.controller.indexed.PodView.gates`.)

Steering (which node to write into a gated pod) and the MIG offer (which GPUs a waiting claim's pod may
use) read pods with it; both are fed pods a tenant wrote, so it is total or raises ValueError (an
operator it cannot read).

The label ``gpuplane.dev/mig-offered`` (``gpuplane.api.mig_offer.NODE_LABEL``) is the controller's own: it
puts it on every node it offers MIG on. A pod that asks for it may use any node the offer could grow
onto, so :func:`node_filter` reads that key as met everywhere (else the offer could never grow for it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuplane.api.mig_offer import NODE_LABEL as MIG_OFFERED
from gpuplane.controller.indexed import PodView


def node_filter(pod: PodView) -> Callable[[str, Mapping[str, str]], bool] | None:
    """A predicate (node name, node labels) -> may the pod go there, from its nodeSelector and required
    node affinity; None when the pod constrains nothing. Raises ValueError on an operator it cannot read.
    The ``gpuplane.dev/mig-offered`` label counts as met on every node (the controller sets it where it offers)."""
    selector = {k: v for k, v in pod.node_selector.items() if k != MIG_OFFERED}
    req = ((pod.affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = [
        {**t, "matchExpressions": [e for e in t.get("matchExpressions") or [] if e.get("key") != MIG_OFFERED]}
        for t in req.get("nodeSelectorTerms") or []
    ]
    if terms and all(not t["matchExpressions"] and not t.get("matchFields") for t in terms):
        terms = []  # only the offer's label: anywhere
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
