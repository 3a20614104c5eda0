"""The controller's wiring: informers and work queues for what it reads, kopf for its own objects.

Two halves, each thin (they translate and delegate to :mod:`gpuplane.controller.runtime` and the
feature packages):

* :func:`make_reads` builds the informers of :mod:`gpuplane.controller.caches` (the fleet-sized
  streams: pods, claims, slices, nodes, and the rest the World reads) with their event handlers,
  which only enqueue: a claim to check, a node to label, a gang to reconcile, the steering loop
  woken. Each queue's worker runs once every informer synced, so no decision sees half-built indexes
  and what the start-up listing queued is done once, on complete indexes.
* :func:`make_registry` registers with kopf what kopf is good at: the GpuGang deletion handler
  (kopf's finalizer), the GpuRequest handlers (event and timer), the controller's background loops
  (started after the informers synced) and the probes. kopf watches only those two custom
  resources: no index, no fleet-sized watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import structlog

from gpuplane.controller import caches, config, heap, indexed, names, rejects, runtime
from gpuplane.controller import fleet_gauges as gauges
from gpuplane.controller.claim import checks, explainer, handling, review
from gpuplane.controller.gang import handlers as gang_handlers
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.imex import reconcile as imex
from gpuplane.controller.node import label_sync, slice_index
from gpuplane.controller.rebalance import act, decide, loop
from gpuplane.controller.rightsize import apply as rightsize
from gpuplane.controller.rightsize import need as rs_need
from gpuplane.controller.rightsize import template as rs_template
from gpuplane.controller.steer import decide as steer_decide
from gpuplane.controller.steer import gate as steer_gate
from gpuplane.controller.steer import reconciler as steer_reconciler
from gpuplane.controller.steer import run as steer_run
from gpuplane.informer.cache import Caches, Event, Informer
from gpuplane.informer.client import Client
from gpuplane.informer.workqueue import WorkQueue

log = structlog.get_logger(__name__)

WORKER_IDLE_S = 0.5
CLAIM_WORKERS = 4  # claim checks in flight (each a few writes in threads)
LABEL_WORKERS = 4  # node label writes in flight (each one PATCH and one Event)

ClaimWork = tuple[bool, dict[str, Any]]  # (quarantined, what the check reads of the claim)


@dataclass(frozen=True)
class Reads:
    """The informers and the work they feed; :meth:`runs` are the coroutines main() runs beside kopf."""

    caches: Caches
    claims: WorkQueue[ClaimWork]
    labels: WorkQueue[None]
    gangs: WorkQueue[None]
    loops: tuple[Callable[[], Coroutine[Any, Any, None]], ...]

    def runs(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        """(name, coroutine) of everything that must run for the process's life."""
        out: list[tuple[str, Coroutine[Any, Any, None]]] = [("informers", self.caches.run())]
        out += [(f"queue {q.name}", q.run()) for q in (self.claims, self.labels, self.gangs)]
        out += [(fn.__name__, fn()) for fn in self.loops]
        return out


def make_reads(cfg: config.ControllerConfig, rt: runtime.Runtime, client: Client | None) -> Reads:
    """The informers, their handlers and queues for ``rt`` (whose ``caches`` they become)."""
    streams = {s.name: s for s in caches.streams(rt.metrics)}
    informers = {name: Informer(client, s) for name, s in streams.items()}
    rt.caches = Caches(list(informers.values()))
    idx = rt.caches.indexes
    ready = rt.caches.wait_synced

    async def check_claim(key: str, work: ClaimWork) -> None:
        rejected, body = work
        if not rejected and key not in idx["claim_idx"]:
            return  # deleted meanwhile
        consumers = list(idx["claim_consumer_idx"].get(key, ()))
        classes = indexed.single(idx["class_idx"])
        if rejected:
            await rejects.refuse_claim(rt, body, classes, consumers)
        else:
            await handling.check_claim(rt, body, classes, consumers)

    async def label(node: str, _: None) -> None:
        entry = next(iter(idx["node_idx"].get(node, ())), None)
        await label_sync.sync_node_label(rt, node, entry, list(idx["slice_idx"].get(node, ())))

    async def gang(key: str, _: None) -> None:
        await gang_handlers.reconcile(rt, key, gang_run.world_now)

    claims = WorkQueue("claims", check_claim, ready=ready, workers=CLAIM_WORKERS)
    labels = WorkQueue("node-labels", label, ready=ready, workers=LABEL_WORKERS)
    gangs = WorkQueue("gangs", gang, ready=ready)
    gate = steer_decide.Settings().gate

    def touched(event: Event) -> None:
        rt.touched()

    def pod_event(event: Event) -> None:
        labels_ = (event.obj.get("metadata") or {}).get("labels") or {}
        if names.LABEL_GANG in labels_ or any(i == "member_pod_idx" for i, _ in event.entries):
            rt.touched()
        if event.type != "DELETED" and any(
            steer_gate.held_by(p, gate) for p in idx["pending_pod_idx"].get(event.key, ())
        ):  # the pod as just indexed
            rt.state(steer_reconciler.SteerState).wake.set()  # the steering loop coalesces any number of these

    def claim_event(event: Event) -> None:
        rt.touched()
        if event.type == "DELETED":
            return
        rejected = rejects.rejected(event.obj)
        claims.add(event.key, (rejected, dict(event.obj) if rejected else review.essentials(event.obj)))

    def slice_event(event: Event) -> None:
        rt.touched()
        node = (event.obj.get("spec") or {}).get("nodeName")
        for n in {str(node)} if node else {k for i, k in event.entries if i == "slice_idx"}:
            labels.add(n, None)

    def node_event(event: Event) -> None:
        rt.touched()
        if event.type != "DELETED":
            labels.add(event.key, None)

    def gang_event(event: Event) -> None:
        rt.touched()
        if event.type == "DELETED":  # released already (gang.handlers); every replica drops its caches
            gang_handlers.gang_gone(rt, event.key)
        elif not (event.obj.get("metadata") or {}).get("deletionTimestamp"):
            gangs.add(event.key, None)

    for name, handler in (
        ("gangs", gang_event),
        ("pods", pod_event),
        ("claims", claim_event),
        ("slices", slice_event),
        ("nodes", node_event),
        ("classes", touched),
        ("jobs", touched),
        ("leaderworkersets", touched),
    ):
        informers[name].handlers.append(handler)

    async def resync_gangs() -> None:
        """Every gang reconciled again every ``--resync`` seconds (level-triggered: nothing is missed for good)."""
        await ready()
        while True:
            await asyncio.sleep(cfg.resync_s)
            for key in list(idx["gang_idx"]):
                gangs.add(key, None)

    async def steer_loop() -> None:
        """A pass whenever a gated pod changed, and every resync period while any is gated."""
        await ready()
        wake = rt.state(steer_reconciler.SteerState).wake
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=cfg.resync_s)
            woken = wake.is_set()
            wake.clear()
            if not rt.leading():
                continue
            pending = list(indexed.single(idx["pending_pod_idx"]).values())
            if not woken and not any(steer_gate.held_by(p, gate) for p in pending):
                continue
            try:
                async with rt.lock():
                    await steer_run.steer_pass(
                        rt,
                        gang_run.world_now(rt),
                        pending=pending,
                        templates=indexed.single(idx["claim_template_idx"]),
                        now=time.time(),
                        node_labels=steer_run.node_labels(indexed.single(idx["node_idx"])),
                    )
            except Exception:  # the loop must outlive any one pass
                log.exception("steering pass failed; retrying on the next wake")

    rt.metrics.observe(informers.values(), (claims, labels, gangs))
    return Reads(rt.caches, claims, labels, gangs, (resync_gangs, steer_loop))


def _start(memo: runtime.Runtime, work: Awaitable[Any]) -> None:
    """A background loop of this process, begun once every informer synced."""
    memo.shared.tasks.append(asyncio.create_task(runtime.after_sync(memo, work)))


def make_registry(cfg: config.ControllerConfig) -> kopf.OperatorRegistry:
    """kopf's part of the controller on a fresh registry."""
    reg = kopf.OperatorRegistry()

    @kopf.on.startup(registry=reg)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True  # no kopf peering: leadership is a Lease (gpuplane.controller.leader)
        # kopf posts no Events: ours say what happened. At ERROR it posted "failed temporarily" on every deleted
        # gang, from the standby that answers "not yet" (gang.handlers) while the leader releases it.
        settings.posting.level = logging.CRITICAL
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=names.GROUP)
        settings.watching.server_timeout = 300
        settings.queueing.idle_timeout = WORKER_IDLE_S  # an object's worker exits this soon after its last event

    imex.register(reg)  # the leader's IMEX plan objects, from the placed gangs (issue 35)
    gang_handlers.register(reg, gang_run.world_now)  # release on deletion (kopf's finalizer holds it until then)

    # Pending claims are explained by a loop over the claim index. The fleet's gauges (pending claims,
    # the largest free block) have a loop of their own, on every replica: the operator's alerts read them.
    @kopf.on.startup(registry=reg)
    async def start_claim_explainer(memo: runtime.Runtime, **_: Any) -> None:
        idx = memo.caches.indexes

        def begin() -> explainer.Explain:  # once per pass: the classes and the world, copied once
            classes, w = indexed.single(idx["class_idx"]), gang_run.world_now(memo)

            async def explain(claim: indexed.ClaimView, now: float) -> None:
                if not checks.ours_in(claim.requests, classes):  # a claim the decoder refused is in no index
                    return
                async with memo.lock():
                    await handling.explain_claim(memo, claim, classes, w, now)

            return explain

        _start(memo, explainer.run(idx["claim_idx"], begin, memo.leading, max(cfg.claim_explain_after_s, 5.0)))
        interval = cfg.fleet_gauges_interval_s
        _start(memo, gauges.run(memo, lambda: gang_run.world_now(memo), idx["claim_consumer_idx"], interval))

    # --- GpuRequests (right-sizing) -----------------------------------------------------------
    async def gpu_request(body: kopf.Body, memo: runtime.Runtime) -> None:
        if not memo.leading() or not memo.caches.synced():
            return  # the timer comes again
        idx = memo.caches.indexes
        request = rs_need.request_view(body)
        key = request.key
        written = memo.state(rightsize.Templates)
        async with memo.lock():
            existing = indexed.single(idx["template_idx"]).get(key)
            await rightsize.reconcile(
                memo.writer,
                request,
                written.recent(key, existing, time.time()),
                slice_index.every(idx["slice_idx"]),  # keyed by node: every node's slices, not one each
                indexed.single(idx["class_idx"]),
                created=lambda t: written.remember(key, t, time.time()),
            )

    @kopf.on.event(names.GROUP, names.VERSION, rs_template.PLURAL, registry=reg)
    async def gpu_request_event(body: kopf.Body, type: str, memo: Any, **_: Any) -> None:
        if type in ("ADDED", "MODIFIED"):
            await gpu_request(body, memo)

    @kopf.timer(names.GROUP, names.VERSION, rs_template.PLURAL, interval=cfg.rightsize_resync_s, registry=reg)
    async def gpu_request_timer(body: kopf.Body, memo: Any, **_: Any) -> None:
        await gpu_request(body, memo)

    # --- rebalancing: noisy neighbours ---------------------------------------------------------
    @kopf.on.startup(registry=reg)
    async def start_rebalancer(memo: runtime.Runtime, **_: Any) -> None:
        if not cfg.rebalance:
            return
        rebalancer = act.Rebalancer(
            memo.writer,
            decide.Settings(
                persist_s=cfg.noisy_persist_s,
                cooldown_s=cfg.rebalance_cooldown_s,
                budget=cfg.rebalance_budget,
                budget_window_s=cfg.rebalance_budget_window_s,
            ),
            memo.metrics,
            Path(cfg.move_ledger) if cfg.move_ledger else None,
        )
        idx = memo.caches.indexes
        _start(memo, loop.run(rebalancer, memo.leading, idx["slice_idx"], idx["claim_idx"], cfg.rebalance_interval_s))

    @kopf.on.startup(registry=reg)
    async def start_heap_trim(memo: runtime.Runtime, **_: Any) -> None:
        _start(memo, heap.trim_loop(memo.caches.wait_synced))

    @kopf.on.cleanup(registry=reg)
    async def stop_tasks(memo: runtime.Runtime, **_: Any) -> None:
        for task in memo.shared.tasks:
            task.cancel()
        memo.shared.tasks.clear()

    return reg
