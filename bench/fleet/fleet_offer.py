"""Fleet benchmark: the MIG offer (issue 36). The fleet (a) as the controller's offer leaves it, and the time
from a MIG request for a profile the fleet does not publish to its pod bound.

The layout: :func:`initial_offer` runs the controller's own decision (``gpuplane.controller.migoffer.decide``)
on the fleet with the (a) MIG round's claims waiting, so the slices the rounds run on are the driver's
publication under that offer (``FleetSlices.discover(mig_offer=...)``, the driver's discovery).

The step (:func:`offer_latency`): the fleet starts with no GPU offered for MIG; ``requests`` claims for
7g.80gb (one per GPU, so every request needs a GPU newly offered), ``streams`` at a time, each with its
pod; a loop every ``INTERVAL_S`` (the controller's pass interval) reads the claims and pods of the step
from the API, decides as the controller does (``snapshot.waiting``, ``decide.decide``, grace 2 s), and
republishes the nodes whose offer changed through their own publishers, as each driver does on its watch
of the offer. Measured: creation to bound per request (p50, max), and the slice writes per second at the
API server meanwhile. Not measured here: the ConfigMap's propagation to the drivers (one watch event) and
the controller's kopf indexes (it reads the API directly).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client

from bench.dra import dra_overhead, dra_watch
from bench.fleet import fleet_sched
from e2e.plane import fleetslices
from gpuplane.api import mig_offer, names
from gpuplane.api.mig_offer import Offer
from gpuplane.controller import indexed
from gpuplane.controller.migoffer import decide, snapshot

INTERVAL_S = 2.0
PROFILE = "7g.80gb"


def fleet_nodes(slices: fleetslices.FleetSlices, claims: Sequence[indexed.ClaimView] = ()) -> tuple[decide.Node, ...]:
    """The controller's view of the fleet from the publishers' inventories (pool: the GPU product)."""
    base = {
        n: tuple((g.name, g.info.product_name) for g in p.inventory.gpus if g.info.mig_capable)
        for n, p in slices.pools.items()
        if p.inventory is not None
    }
    mig: set[tuple[str, str]] = set()
    whole: set[tuple[str, str]] = set()
    for c in claims:
        for r in c.results:  # this driver's
            device, pool = r.device, r.pool
            gpu = "-".join(device.split("-")[:2])
            (whole if device == gpu else mig).add((pool, gpu))
    return tuple(
        decide.Node(
            name=n,
            pool=gpus[0][1],
            schedulable=True,
            labels={},
            gpus=tuple(
                decide.Gpu(g, product, mig_allocated=(n, g) in mig, whole_allocated=(n, g) in whole)
                for g, product in gpus
            ),
        )
        for n, gpus in sorted(base.items())
        if gpus
    )


def initial_offer(slices: fleetslices.FleetSlices, mig_pods: int) -> Offer:
    """The controller's offer on the idle fleet with ``mig_pods`` 1g.10gb claims waiting."""
    waiting = tuple(decide.Waiting(f"bench/m{i}", frozenset({"1g.10gb"}), None, age_s=10.0) for i in range(mig_pods))
    return decide.decide(fleet_nodes(slices), waiting, decide.Memory(), decide.Settings(), 0.0).offer


def label_nodes(api: client.ApiClient, offer: Offer) -> int:
    """The label the controller keeps on the nodes its offer names (``decide.node_labels`` from none), written as
    the controller writes it; returns the nodes labelled."""
    core = client.CoreV1Api(api)
    changes = decide.node_labels(offer, {n: {} for n in offer.nodes})
    for node, _ in changes:
        core.patch_node(node, {"metadata": {"labels": {mig_offer.NODE_LABEL: mig_offer.NODE_LABEL_VALUE}}})
    return len(changes)


def apply(slices: fleetslices.FleetSlices, offer: Offer, nodes: Sequence[str] | None = None) -> int:
    """Rediscover and republish ``nodes`` (all: None) under ``offer``; returns the slice writes."""
    slices.discover(mig_offer=offer.nodes, names_=nodes)
    done = slices.publish(nodes, what="publish under the MIG offer")
    return sum(done.calls.get(v, 0) for v in ("create", "replace", "update", "reorder", "delete"))


def _claim(name: str, label: str) -> dict[str, Any]:
    body = fleet_sched.claim_body("mig-1g", name, label=label)
    expr = f'device.attributes["{names.DRIVER_NAME}"].migProfile == "{PROFILE}"'
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expr}}]
    return body


class OfferLoop:
    """The controller's pass and the drivers' republish, every INTERVAL_S, on the step's claims."""

    def __init__(self, api: client.ApiClient, slices: fleetslices.FleetSlices, label: str, offer: Offer) -> None:
        self.api, self.slices, self.label = api, slices, label
        self.memory = decide.Memory(offer=offer, written=True)
        self.settings = decide.Settings(spare_per_pool=0, shrink_after_s=3600.0)
        self.slice_writes = 0
        self.offer_writes = 0
        self.passes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: Exception | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def once(self) -> None:
        custom, core = client.CustomObjectsApi(self.api), client.CoreV1Api(self.api)
        selector = f"bench-round={self.label}"
        raw: Any = custom.list_namespaced_custom_object(
            fleet_sched.GROUP, fleet_sched.VERSION, fleet_sched.NAMESPACE, "resourceclaims", label_selector=selector
        )
        claims = {v.key: v for v in map(indexed.claim, raw.get("items") or [])}  # as the claim index keeps them
        pods = {
            f"{p.metadata.namespace}/{p.metadata.name}": indexed.PodView(
                str(p.metadata.name), str(p.metadata.namespace)
            )
            for p in core.list_namespaced_pod(fleet_sched.NAMESPACE, label_selector=selector).items
            if p.metadata is not None and p.spec is not None and not p.spec.node_name
        }
        consumers = {k: [k.partition("/")[2]] for k in claims}  # each claim's pod is called like it
        now = datetime.datetime.now(datetime.UTC)
        waiting = snapshot.waiting(claims, consumers, pods, now)
        d = decide.decide(
            fleet_nodes(self.slices, list(claims.values())), waiting, self.memory, self.settings, time.monotonic()
        )
        changed = sorted({n for n, _ in d.grown} | {n for n, _ in d.withdrawn})
        self.memory = d.memory
        self.passes += 1
        if changed:
            self.offer_writes += 1
            self.slice_writes += apply(self.slices, d.offer, changed)

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            try:
                self.once()
            except Exception as exc:  # the step reports it; the loop goes on
                self.error = exc


def offer_latency(
    api: client.ApiClient,
    slices: fleetslices.FleetSlices,
    *,
    requests: int,
    streams: int,
    timeout: float,
    out: Callable[[str], None] = print,
) -> str:
    """The step: a Markdown paragraph with the figures."""
    label = "offer-latency"
    empty = Offer()
    out("MIG offer: every GPU withdrawn from MIG (the fleet publishes no MIG placement) ...")
    apply(slices, empty)
    loop = OfferLoop(api, slices, label, empty)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    watch = fleet_sched.BindWatch(api, label)
    watch.start()
    latencies: list[float] = []
    lock = threading.Lock()
    todo = list(range(requests))

    def stream() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            name = f"{label}-{i:04d}"
            custom.create_namespaced_custom_object(
                fleet_sched.GROUP, fleet_sched.VERSION, fleet_sched.NAMESPACE, "resourceclaims", _claim(name, label)
            )
            start = time.monotonic()
            body: Any = fleet_sched.pod_body("mig-1g", name, label)
            core.create_namespaced_pod(fleet_sched.NAMESPACE, body)

            def bound(n: str = name) -> bool:
                return n in watch.bound

            dra_watch.wait(bound, timeout, f"{name} bound")
            with lock:
                latencies.append(watch.bound[name] - min(watch.seen.get(name, start), start))

    loop.start()
    started = time.monotonic()
    threads = [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = time.monotonic() - started
    loop.stop()
    watch.stop()
    fleet_sched.delete_round(api, label, timeout)
    s = dra_overhead.summary(latencies) if latencies else {"p50": 0.0, "p99": 0.0, "max": 0.0}
    out(f"  MIG offer latencies (s, sorted): {' '.join(f'{x:.1f}' for x in sorted(latencies))}")
    return (
        f"{len(latencies)}/{requests} requests for MIG {PROFILE} (one per GPU: each needs a GPU newly offered), "
        f"{streams} at a time, the fleet offering no MIG at the start: creation to bound p50 {s['p50']:.2f} s, "
        f"p99 {s['p99']:.2f} s, max {s['max']:.2f} s, over {span:.0f} s. "
        f"Offer loop: {loop.passes} passes every {INTERVAL_S:.0f} s, "
        f"{loop.offer_writes} offer changes, {loop.slice_writes} slice writes "
        f"({loop.slice_writes / max(span, 1e-9):.2f}/s at the API server)"
        + (f"; loop error: {loop.error}" if loop.error else "")
        + "."
    )
