"""MIG-offer attacks of tests/e2e/tenant_attacks.py::ATTACKS (issue 36, found while writing it), and their evidence.

Every MIG-capable GPU the controller offers publishes its MIG placements, and kube-scheduler walks them for
every pod of every tenant (docs/scheduler-cost.md). The offer grows for waiting MIG claims, and a waiting
claim is any tenant's to make. So a tenant could turn the fleet's catalogue on with pods that never run:
held by a scheduling gate of its own, or asking for something no node has. What must hold
(docs/mig-offer.md):

* a pod held by its owner's own gate asks nothing of the offer: it does not grow, and its claims are told
  nothing (``migoffer.snapshot.tried``);
* pods the scheduler tries but can never place (here: a CPU request no node has) get room on at most
  ``--mig-offer-gpus-per-namespace`` GPUs (:data:`PER_NAMESPACE`, the e2e controllers' flag), and the claims past
  it are told why they wait.

The claims ask for ``7g.80gb`` (a whole H100 each, so each needs a GPU of its own); the attacker's pods are
deleted after each attack. The offer keeps what it grew for the shrink delay (600 s), at most
:data:`PER_NAMESPACE` GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.e2e.conftest import GpuCluster, eventually
from tests.e2e.tenantkit import Arena, claim, pod
from tests.e2e.test_mig_offer import offer

PER_NAMESPACE = 4  # e2e.plane.components.controller_argv: --mig-offer-gpus-per-namespace
PODS = 8  # twice the bound
MIG_CLASS = "mig.gpuplane.dev"
PROFILE = "7g.80gb"
OWN_GATE = "tenant.example/hold"
BOUND_FLAG = "--mig-offer-gpus-per-namespace"


def mig_claim(ns: str, name: str) -> dict[str, Any]:
    body = claim(ns, name, MIG_CLASS)
    expr = f'device.attributes["gpu.gpuplane.dev"].migProfile == "{PROFILE}"'
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expr}}]
    return body


def offered(gc: GpuCluster) -> int:
    got = offer(gc)
    return got.gpu_count() if got is not None else 0


def told(gc: GpuCluster, ns: str, prefix: str) -> dict[str, str]:
    """Claim name -> the WaitingForMigOffer Event's message, for the claims of ``ns`` named ``prefix``..."""
    items = gc.kubectl_json("get", "events", "-n", ns, "--field-selector", "reason=WaitingForMigOffer")["items"]
    return {
        e["involvedObject"]["name"]: str(e.get("message"))
        for e in items
        if e["involvedObject"].get("kind") == "ResourceClaim" and e["involvedObject"]["name"].startswith(prefix)
    }


def _clean(gc: GpuCluster, ns: str, prefix: str) -> None:
    names = [f"{prefix}{i}" for i in range(PODS)]
    gc.cluster.kubectl("delete", "pod", "-n", ns, "--ignore-not-found", "--wait=true", *names, timeout=120)
    gc.cluster.kubectl("delete", "resourceclaim", "-n", ns, "--ignore-not-found", "--wait=true", *names, timeout=120)


def _flood(arena: Arena, prefix: str, shape: Callable[[dict[str, Any]], None]) -> None:
    """As the attacker: ``PODS`` MIG claims ``<prefix><i>``, each with its pod, the pod shaped by ``shape``."""
    a = arena.attacker
    for i in range(PODS):
        a.must_create(mig_claim(a.ns, f"{prefix}{i}"))
        body = pod(a.ns, f"{prefix}{i}", claim_name=f"{prefix}{i}")
        shape(body["spec"])
        a.must_create(body)


def _held(spec: dict[str, Any]) -> None:
    spec["schedulingGates"] = [{"name": OWN_GATE}]


def _unplaceable(spec: dict[str, Any]) -> None:
    spec["containers"][0]["resources"]["requests"] = {"cpu": "100000"}  # no node has it


def held_mig_flood(arena: Arena) -> str:
    a, gc = arena.attacker, arena.gc
    before = offered(gc)
    try:
        _flood(arena, "held-", _held)
        time.sleep(12)  # six passes of the offer: each would grow it for a claim it counted
        after, events = offered(gc), told(gc, a.ns, "held-")
        assert after <= before and not events, (
            f"the offer grew {before} -> {after} GPUs for {PODS} pods held by the tenant's own gate; told {events}"
        )
    finally:
        _clean(gc, a.ns, "held-")
    return f"{PODS} {PROFILE} claims of pods held by its own gate: offer {before} -> {after} GPUs, no claim told"


def unplaceable_mig_flood(arena: Arena) -> str:
    a, gc = arena.attacker, arena.gc
    before = offered(gc)
    try:
        _flood(arena, "never-", _unplaceable)

        def every_claim_told() -> dict[str, str] | None:
            got = told(gc, a.ns, "never-")
            return got if len(got) == PODS else None

        events = eventually(every_claim_told, 60, "every claim told")
        time.sleep(6)  # three more passes: the bound holds over time, not only at the first decision
        after = offered(gc)
        given = [m for m in events.values() if m.startswith("waiting for a MIG offer on ")]
        capped = [m for m in events.values() if BOUND_FLAG in m]
        assert len(given) <= PER_NAMESPACE and after - before <= PER_NAMESPACE, (
            f"{len(given)} claims given room, offer {before} -> {after} GPUs (bound {PER_NAMESPACE}): {events}"
        )
        assert capped, f"no claim was told of the namespace's bound: {events}"
    finally:
        _clean(gc, a.ns, "never-")
    return (
        f"{PODS} {PROFILE} claims of pods no node can run: {len(given)} given room, {len(capped)} told of the "
        f"bound ({PER_NAMESPACE} GPUs per namespace), offer {before} -> {after} GPUs"
    )
