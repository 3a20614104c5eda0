"""Liveness and readiness of the controller: kopf's health endpoint with a probe of our own.

kopf serves ``/healthz`` (``--liveness``, port 8080 in the Deployment) from its
asyncio event loop and runs every ``@kopf.on.probe`` handler to answer it. So the
answer itself proves the loop that runs every handler still turns: a loop
blocked by a handler that never yields gives no answer and kubelet's probe
times out (the Deployment's liveness and readiness probes both use it, unlike
/metrics, which prometheus_client serves from a thread of its own). The probe
added here also fails (HTTP 500) when the leader-election thread has died or
stopped stepping: such a replica could never take over from the leader. Its
result (is this replica the leader, which term) is the JSON body.
"""

from __future__ import annotations

from typing import Any

import kopf

from gpuplane.controller import leader

PROBE_ID = "leader-election"


def add_probes(registry: kopf.OperatorRegistry, elector: leader.Elector | None) -> None:
    """Register the controller's probe on ``registry`` (``elector`` None: no election, standalone)."""

    @kopf.on.probe(id=PROBE_ID, registry=registry)
    def leader_election(memo: Any, **_: Any) -> dict[str, Any]:
        if elector is None:
            return {"standalone": True}
        problem = elector.stalled()
        if problem is not None:
            raise kopf.PermanentError(f"{problem}: this replica could never take over; restart it")
        return {"leader": elector.is_leader(), "term": elector.term, "holder": elector.holder()}
