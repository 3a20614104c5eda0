"""An object that stops qualifying for an index leaves it, and the plan sees the change (the controller's informers).

Under kopf (1.45) an index handler that returned None kept the object's earlier entry, so a pod
indexed while pending stayed in ``pending_pod_idx`` after it was bound (fleet run 10: about 3,000
bound pods, 40 MB of the leader). The informer (:mod:`gpuplane.informer.cache`) replaces an
object's entries on every event: what an indexer no longer returns is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplane.api import boundedjson
from gpuplane.controller import caches, config, handlers, metrics, runtime


def _reads() -> tuple[runtime.Runtime, handlers.Reads]:
    cfg = config.parse_args(["--identity", "x"], {})
    rt = runtime.Runtime.create(cfg, None, metrics.ControllerMetrics())  # type: ignore[arg-type]
    return rt, handlers.make_reads(cfg, rt, None)


def _pod(node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}], "resourceClaims": [{"name": "g"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": "p", "uid": "u1"}, "spec": spec}


def _too_deep(raw: dict[str, Any]) -> Any:
    """``raw`` with a field nested past the decoder's bound, as the decoder hands it on."""
    stub = boundedjson.quarantine({**raw, "spec": {**(raw.get("spec") or {}), "deep": boundedjson.TOO_DEEP}})
    assert boundedjson.rejection(stub) is not None
    return stub


def test_a_pending_pod_leaves_the_pending_index_when_it_is_bound() -> None:
    """A bound pod's entry in ``pending_pod_idx`` is dropped on its next event."""
    _, reads = _reads()
    pods = reads.caches.informer("pods")
    pods.apply("ADDED", _pod())
    assert list(reads.caches.indexes["pending_pod_idx"]) == ["ns/p"]
    pods.apply("MODIFIED", _pod(node="n1"))
    assert list(reads.caches.indexes["pending_pod_idx"]) == []


def test_a_gang_that_turns_unreadable_leaves_the_index_and_the_plan_sees_it() -> None:
    """A quarantined gang is in no index, and the change bumps the plan's version."""
    rt, reads = _reads()
    gangs = reads.caches.informer("gangs")
    gang = {"metadata": {"namespace": "ns", "name": "g", "uid": "u2"}, "spec": {"size": 2}}
    gangs.apply("ADDED", gang)
    assert list(reads.caches.indexes["gang_idx"]) == ["ns/g"]
    version = rt.shared.version
    gangs.apply("MODIFIED", _too_deep(gang))
    assert list(reads.caches.indexes["gang_idx"]) == [] and rt.shared.version > version


def test_every_indexer_answers_a_mapping_and_none_indexes_a_quarantined_object() -> None:
    """Every index declines a quarantined object with an empty mapping (the informer then drops its entry)."""
    bodies = [_too_deep(_pod()), _pod(node="n1"), {"metadata": {"namespace": "ns", "name": "o", "uid": "u4"}}]
    for stream in caches.streams(metrics.ControllerMetrics()):
        for name, indexer in stream.indexers.items():
            for raw in bodies:
                assert isinstance(indexer(raw), Mapping), (name, raw)
            assert dict(indexer(bodies[0])) == {}, name
