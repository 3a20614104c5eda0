"""An object that stops qualifying for an index leaves it (kopf's own indexing machinery, no cluster).

kopf (1.45) keeps an object's earlier index entry when its index handler returns None
(``OperatorIndexers.replace`` stores non-None results and purges only handlers filtered out), so a
pod indexed while pending stayed in ``pending_pod_idx`` after it was bound, a deep copy of its spec
each, until the pod was deleted: in fleet run 10 about 3,000 bound pods, 40 MB of the long-lived
leader, and the steering loop walked them every pass. Handlers now return an empty mapping.
"""

from __future__ import annotations

from typing import Any

import kopf
from kopf._core.actions import execution
from kopf._core.engines import indexing

from gpuplane.api import boundedjson
from gpuplane.controller import config, handlers, metrics, runtime

REG = handlers.make_registry(config.parse_args(["--identity", "x"], {}))
BY_ID = {str(h.id): h for h in REG._indexing.get_all_handlers()}


def _memo() -> runtime.Runtime:
    return runtime.Runtime.create(config.parse_args(["--identity", "x"], {}), None, metrics.ControllerMetrics())  # type: ignore[arg-type]


def _index(indexers: indexing.OperatorIndexers, hid: str, raw: dict[str, Any], memo: runtime.Runtime) -> None:
    """What kopf does with one event of ``raw`` for the handler ``hid``: call it, then store its outcome."""
    body = kopf.Body(raw)
    meta = raw.get("metadata") or {}
    result = BY_ID[hid].fn(body=body, namespace=meta.get("namespace"), name=meta.get("name"), memo=memo)
    indexers.replace(body, {BY_ID[hid].id: execution.Outcome(final=True, result=result)})


def _pod(node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}], "resourceClaims": [{"name": "g"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": "p", "uid": "u1"}, "spec": spec}


def _too_deep(raw: dict[str, Any]) -> Any:
    """``raw`` with a field nested past the decoder's bound, as the decoder hands it to kopf."""
    stub = boundedjson.quarantine({**raw, "spec": {**(raw.get("spec") or {}), "deep": boundedjson.TOO_DEEP}})
    assert boundedjson.rejection(stub) is not None
    return stub


def _fresh(hid: str) -> indexing.OperatorIndexers:
    indexers = indexing.OperatorIndexers()
    indexers.ensure([BY_ID[hid]])
    return indexers


def test_a_pending_pod_leaves_the_pending_index_when_it_is_bound() -> None:
    indexers, memo = _fresh("pending_pod_idx"), _memo()
    _index(indexers, "pending_pod_idx", _pod(), memo)
    assert list(indexers.indices["pending_pod_idx"]) == ["ns/p"]
    _index(indexers, "pending_pod_idx", _pod(node="n1"), memo)
    assert list(indexers.indices["pending_pod_idx"]) == []


def test_a_gang_that_turns_unreadable_leaves_the_index_and_the_plan_sees_it() -> None:
    indexers, memo = _fresh("gang_idx"), _memo()
    gang = {"metadata": {"namespace": "ns", "name": "g", "uid": "u2"}, "spec": {"size": 2}}
    _index(indexers, "gang_idx", gang, memo)
    assert list(indexers.indices["gang_idx"]) == ["ns/g"]
    version = memo.shared.version
    _index(indexers, "gang_idx", _too_deep(gang), memo)
    assert list(indexers.indices["gang_idx"]) == [] and memo.shared.version > version


def test_no_index_handler_answers_none() -> None:
    """None would keep the object's earlier entry; every handler declines with a mapping instead."""
    memo = _memo()
    bodies = [_too_deep(_pod()), _pod(node="n1"), {"metadata": {"namespace": "ns", "name": "o", "uid": "u4"}}]
    for hid, h in BY_ID.items():
        for raw in bodies:
            result = h.fn(body=kopf.Body(raw), namespace="ns", name="o", memo=memo)
            assert result is not None, (hid, raw)
