"""A gang's reconcile against the running controller: the World copied from the indexes, the queue plan reused
while nothing changed, decide in a thread and apply, and the victims' statuses.

:class:`GangState` is what this feature keeps per process (``rt.state(GangState)``): the last plan, the
write overlay (decisions written but not yet seen by this replica's indexes), status coalescing, and the
World and domain caches.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import structlog

from gpuplane.controller import config, indexed, kube, runtime
from gpuplane.controller.gang import queue_runner, reconciler, status, world
from gpuplane.controller.gang.podview import MemberPodView
from gpuplane.controller.gang.view import GangView
from gpuplane.controller.imex import hold
from gpuplane.controller.node import snapshot_builder

log = structlog.get_logger(__name__)

OVERLAY_TTL_S = 30.0
PLAN_REUSE_MAX_S = 5.0


@dataclass
class GangState:
    """The gang feature's per-process caches; a new term drops the plan, the overlay and the coalescing."""

    coalescer: status.Coalescer
    plan: tuple[int, queue_runner.Plan, snapshot_builder.ClusterView] | None = None
    plan_at: float = 0.0  # monotonic time the plan was computed
    plan_build_s: float = 0.0  # how long that took (capped at PLAN_REUSE_MAX_S): the plan's reuse window
    overlay: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    domains: world.DomainCache = field(default_factory=world.DomainCache)  # GPU -> domain, for holding gangs
    worlds: world.CopyCache = field(default_factory=world.CopyCache)  # the last copy of the indexes

    @classmethod
    def create(cls, cfg: config.ControllerConfig) -> Self:
        """Status writes coalesced at the configured interval."""
        return cls(coalescer=status.Coalescer(cfg.status_interval_s))

    def new_term(self) -> None:
        """An earlier term's plan and unconfirmed writes say nothing of what is written now."""
        self.plan = None
        self.overlay.clear()
        self.coalescer.reset()


def settings(cfg: config.ControllerConfig) -> reconciler.Settings:
    """Reconcile settings from the config."""
    return reconciler.Settings(
        eviction_grace_s=cfg.eviction_grace_s,
        bind_timeout_s=cfg.bind_timeout_s,
        imex_ready_timeout_s=cfg.imex_ready_timeout_s,
        queue=queue_runner.Settings(aging_s=cfg.aging_s, aging_cap=cfg.aging_cap, starvation_s=cfg.starvation_s),
    )


def world_now(rt: runtime.Runtime) -> world.World:
    """The World from the caches' indexes now (:func:`make_world`)."""
    idx = rt.caches.indexes
    return make_world(
        rt,
        gang_idx=idx["gang_idx"],
        job_idx=idx["gang_job_idx"],
        lws_idx=idx["gang_lws_idx"],
        pod_idx=idx["member_pod_idx"],
        claim_idx=idx["claim_idx"],
        slice_idx=idx["slice_idx"],
        node_idx=idx["node_idx"],
        class_idx=idx["class_idx"],
        now=time.time(),
    )


def make_world(
    rt: runtime.Runtime,
    *,
    gang_idx: Mapping[Any, Iterable[Any]],
    pod_idx: Mapping[Any, Iterable[Any]],
    claim_idx: Mapping[Any, Iterable[Any]],
    slice_idx: Mapping[Any, Iterable[Any]],
    node_idx: Mapping[Any, Iterable[Any]],
    class_idx: Mapping[Any, Iterable[Any]],
    now: float,
    job_idx: Mapping[Any, Iterable[Any]] | None = None,
    lws_idx: Mapping[Any, Iterable[Any]] | None = None,
) -> world.World:
    """Copy the indexes into a World (synchronously: one consistent instant), with the write overlay; the
    last copy again while nothing indexed or overlaid has changed (``world.CopyCache``)."""
    gs = rt.state(GangState)
    inputs = (gang_idx, pod_idx, claim_idx, slice_idx, node_idx, class_idx, job_idx, lws_idx)
    reused = gs.worlds.get(rt.shared.version, now, inputs)
    if reused is not None:
        return reused
    gangs_: dict[str, GangView] = indexed.single(gang_idx)
    fresh: dict[str, dict[str, Any]] = {}
    for key, (when, patch) in list(gs.overlay.items()):
        seen = gangs_[key].status if key in gangs_ else {}
        want_id = ((patch.get("placement") or {}) or {}).get("id")
        caught_up = seen.get("phase") == patch.get("phase") and (
            want_id is None or (seen.get("placement") or {}).get("id") == want_id
        )
        if caught_up or now - when > OVERLAY_TTL_S or key not in gangs_:
            del gs.overlay[key]
        else:
            fresh[key] = patch
    pods: list[MemberPodView] = [p for store in pod_idx.values() for p in store]
    nodes_ = indexed.single(node_idx)
    w = world.World(
        gangs=world.overlay(gangs_, fresh),
        pods=world.member_lists(pods),
        claims=indexed.single(claim_idx),
        slices=tuple(d for store in slice_idx.values() for d in store),
        nodes={k: v.schedulable for k, v in nodes_.items()},
        addresses={k: v.address for k, v in nodes_.items() if v.address},
        classes=indexed.single(class_idx),
        jobs={key: tuple(store) for key, store in (job_idx or {}).items()},
        leaderworkersets={key: tuple(store) for key, store in (lws_idx or {}).items()},
    )
    gs.worlds.put(rt.shared.version, now, inputs, w)
    return w


def plan_for(
    rt: runtime.Runtime, w: world.World, now: float, max_age_s: float = 0.0
) -> tuple[queue_runner.Plan, snapshot_builder.ClusterView]:
    """The queue plan, reused while nothing indexed changed, and otherwise for as long as it took to build (at
    most ``PLAN_REUSE_MAX_S``; at least ``max_age_s``), so the pass (a second on the loop at 1,000 nodes and
    10,000 claims; rebuilt per gang event it held the loop for minutes, docs/benchmarks.md) takes half of it."""
    gs = rt.state(GangState)
    cached = gs.plan
    window = max(max_age_s, gs.plan_build_s)
    if cached is not None and (cached[0] == rt.shared.version or time.monotonic() - gs.plan_at < window):
        return cached[1], cached[2]
    started = time.monotonic()
    view = world.cluster_view(w)
    entries = world.entries(w, view)
    compiled = {e.key: world.admit_for(w, e.spec) for e in entries}
    plan = queue_runner.plan(
        entries, view, lambda e: compiled[e.key].predicate, rt.policy, now=now, settings=settings(rt.cfg).queue
    )
    rt.metrics.pass_seconds.observe(time.monotonic() - started)
    rt.metrics.queue_depth.set(sum(1 for a in plan.actions.values() if a.kind != "place"))
    gs.plan = (rt.shared.version, plan, view)
    gs.plan_at = time.monotonic()
    gs.plan_build_s = min(PLAN_REUSE_MAX_S, gs.plan_at - started)
    return plan, view


def overlay_entry(written: Mapping[str, Any], gang: GangView) -> dict[str, Any]:
    """What this replica's cache must show of a gang until its status write comes back: phase and placement.

    A status that leaves ``placement`` out keeps the one the gang holds (``gang`` is the gang as
    this reconcile saw it, overlay included): recording None there let a stale cached body
    without a placement turn a ``Placed`` gang back into ``Pending`` one reconcile later.
    """
    placement = written["placement"] if "placement" in written else gang.status.get("placement")
    return {"phase": written.get("phase"), "placement": placement}


async def reconcile_gang(rt: runtime.Runtime, key: str, w: world.World, now: float) -> None:
    """Decide and apply for one gang (and release the victims it preempts), under the process lock."""
    if not rt.leading():
        return
    try:
        await _reconcile_gang(rt, key, w, now)
    except kube.NotLeader:
        log.info("lost leadership during a reconcile; the new leader resumes from the API", gang=key)


async def _reconcile_gang(rt: runtime.Runtime, key: str, w: world.World, now: float) -> None:
    gs = rt.state(GangState)
    cfg = settings(rt.cfg)
    gang = w.gangs.get(key)
    if gang is None:
        gs.coalescer.forget(key)
        return
    if gang.deleting:  # being released (gang.handlers): nothing to decide
        return
    made: list[tuple[queue_runner.Plan, snapshot_builder.ClusterView]] = []

    def planned() -> tuple[queue_runner.Plan, snapshot_builder.ClusterView]:
        if not made:
            made.append(plan_for(rt, w, now))
        return made[0]

    # In a thread (the world is a copy; the caches it fills are used under the process lock only): a queue
    # pass takes ~0.5 s at 1,000 nodes, and on the loop it stopped every watch meanwhile (fleet runs 7-8).
    outcome = await asyncio.to_thread(
        functools.partial(
            reconciler.decide,
            key,
            gang,
            w,
            planned=planned,
            domains=lambda: gs.domains.of(w),
            now=now,
            settings=cfg,
            imex=rt.state(hold.ImexState).written,
        )
    )
    if outcome.victims:  # every victim pod's eviction dry-run first: a PodDisruptionBudget may refuse it
        outcome = await asyncio.to_thread(reconciler.checked_preemption, rt.writer, gang, outcome, w, cfg)
    written, _ = await asyncio.to_thread(
        functools.partial(
            reconciler.apply, rt.writer, rt.writer, gs.coalescer, key=key, gang=gang, outcome=outcome, now=now
        )
    )
    if "phase" in written or outcome.victims:
        log.info(
            "gang decision",
            gang=key,
            previous=gang.phase,
            phase=outcome.status.get("phase"),
            reason=outcome.status.get("reason"),
            action=getattr(made[0][0].actions.get(key), "kind", None) if made else None,
            victims=list(outcome.victims),
        )
    if written:
        rt.metrics.status_writes.inc()
        rt.metrics.decisions.labels(outcome=str(outcome.status.get("phase", "")).lower()).inc()
        if "phase" in written or "placement" in written:
            gs.overlay[key] = (now, overlay_entry(outcome.status, gang))
            rt.touched()
    if outcome.placed_after_s is not None and written.get("placement"):
        rt.metrics.wait_seconds.observe(max(0.0, outcome.placed_after_s))
    for victim in outcome.victims:
        vo = reconciler.victim_outcome(victim, key, w, cfg)
        if vo is None:
            continue
        vgang = w.gangs[victim]
        vwritten, _ = await asyncio.to_thread(
            functools.partial(
                reconciler.apply, rt.writer, rt.writer, gs.coalescer, key=victim, gang=vgang, outcome=vo, now=now
            )
        )
        rt.metrics.decisions.labels(outcome="preempted").inc()
        log.info("gang preempted", gang=victim, preemptor=key, status_written=bool(vwritten))
        if vwritten:
            gs.overlay[victim] = (now, {"phase": "Preempted", "placement": None})
            rt.touched()
