"""The operator's memo: shared clients and state, and the orchestration each handler delegates to.

kopf shallow-copies the memo per object, so every mutable thing lives in
:class:`Shared`, referenced (not copied) by each copy. Nothing here is a
decision store: decisions live in the API (gang status, claim annotations);
``Shared`` only caches (the last queue plan, decisions written but not yet
seen by this replica's indexes) and rate-limits (status coalescing).

Every entry point first asks :meth:`Runtime.leading`: a standby replica keeps
its indexes warm but decides and writes nothing. The caches are dropped
whenever this replica starts a new leadership term, and a write refused
mid-reconcile (:class:`gpuplane.controller.kube.NotLeader`) ends the reconcile quietly.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from gpuplane.controller import config, events, indexed, kube, leader, names
from gpuplane.controller import metrics as metrics_mod
from gpuplane.controller.claim import checks
from gpuplane.controller.gang import queue_runner, reconciler, status, world
from gpuplane.controller.imex import hold
from gpuplane.controller.node import labels, snapshot_builder
from gpuplane.controller.rightsize import template as rs_template
from gpuplane.controller.steer import reconciler as steer_reconciler
from gpuplane.informer.cache import Caches
from gpuplane.placement.policies import base as policy_base
from gpuplane.placement.policies import make as make_policy

log = structlog.get_logger(__name__)

T = TypeVar("T")
OVERLAY_TTL_S = 30.0
PLAN_REUSE_MAX_S = 5.0


@dataclass
class Shared:
    """Mutable state shared by every memo copy (one per process)."""

    lock: asyncio.Lock | None = None
    version: int = 0
    plan: tuple[int, queue_runner.Plan, snapshot_builder.ClusterView] | None = None
    plan_at: float = 0.0  # monotonic time the plan was computed
    plan_build_s: float = 0.0  # how long that took (capped at PLAN_REUSE_MAX_S): the plan's reuse window
    overlay: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    steer: steer_reconciler.SteerState = field(default_factory=steer_reconciler.SteerState)
    steer_wake: asyncio.Event = field(default_factory=asyncio.Event)  # the steering loop: a gated pod changed
    term: int = 0  # the leadership term the caches above belong to
    templates: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)  # right-sizing writes in flight
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)  # background loops (rebalancing, replay)
    claim_notes: dict[str, dict[str, str | None]] = field(default_factory=dict)  # uid -> annotations written
    reasons: checks.ReasonCache = field(default_factory=checks.ReasonCache)  # unallocated claims' explanations
    domains: world.DomainCache = field(default_factory=world.DomainCache)  # GPU -> domain, for holding gangs
    worlds: world.CopyCache = field(default_factory=world.CopyCache)  # the last copy of the indexes
    imex: hold.Written | None = None  # what this term's last IMEX pass left in the API (gates wait on it)


@dataclass
class Runtime:
    """What every handler gets as ``memo``."""

    cfg: config.ControllerConfig
    writer: kube.KubeWriter
    metrics: metrics_mod.ControllerMetrics
    coalescer: status.Coalescer
    policy: policy_base.Policy
    leadership: leader.Leadership = field(default_factory=leader.AlwaysLeader)
    shared: Shared = field(default_factory=Shared)
    caches: Caches = field(default_factory=lambda: Caches([]))  # the informers' indexes (controller.caches)

    @classmethod
    def create(
        cls,
        cfg: config.ControllerConfig,
        writer: kube.KubeWriter,
        m: metrics_mod.ControllerMetrics,
        leadership: leader.Leadership | None = None,
    ) -> Runtime:
        """Build the memo once in main()."""
        return cls(
            cfg=cfg,
            writer=writer,
            metrics=m,
            coalescer=status.Coalescer(cfg.status_interval_s),
            policy=make_policy(cfg.policy),
            leadership=leadership or leader.AlwaysLeader(),
        )

    def __copy__(self) -> Runtime:
        """Itself: kopf copies the memo for every object it sees; what changes lives in ``shared``."""
        return self

    def leading(self) -> bool:
        """Whether this replica may decide now; a new term drops what an earlier term cached."""
        if not self.leadership.is_leader():
            return False
        term = self.leadership.term
        if term != self.shared.term:
            self.shared.term = term
            self.shared.plan = None
            self.shared.overlay.clear()
            self.shared.templates.clear()
            self.shared.steer.clear()
            self.shared.claim_notes.clear()
            self.shared.imex = None  # an earlier term's pass says nothing of what is written now
            self.coalescer.reset()
            self.metrics.leader_terms.inc()
        return True

    @property
    def settings(self) -> reconciler.Settings:
        """Reconcile settings from the config."""
        c = self.cfg
        return reconciler.Settings(
            eviction_grace_s=c.eviction_grace_s,
            bind_timeout_s=c.bind_timeout_s,
            imex_ready_timeout_s=c.imex_ready_timeout_s,
            queue=queue_runner.Settings(aging_s=c.aging_s, aging_cap=c.aging_cap, starvation_s=c.starvation_s),
        )

    def touched(self) -> None:
        """An indexed object changed: the cached plan is stale."""
        self.shared.version += 1

    def lock(self) -> asyncio.Lock:
        """The process-wide reconcile lock (created lazily inside the event loop)."""
        if self.shared.lock is None:
            self.shared.lock = asyncio.Lock()
        return self.shared.lock


async def after_sync(rt: Runtime, work: Awaitable[T]) -> T:
    """``work`` awaited once every informer synced (nothing decides on half-built indexes)."""
    await rt.caches.wait_synced()
    return await work


def world_now(rt: Runtime) -> world.World:
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
    rt: Runtime,
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
    inputs = (gang_idx, pod_idx, claim_idx, slice_idx, node_idx, class_idx, job_idx, lws_idx)
    reused = rt.shared.worlds.get(rt.shared.version, now, inputs)
    if reused is not None:
        return reused
    gangs_ = indexed.single(gang_idx)
    fresh: dict[str, dict[str, Any]] = {}
    for key, (when, patch) in list(rt.shared.overlay.items()):
        seen = (gangs_.get(key) or {}).get("status") or {}
        want_id = ((patch.get("placement") or {}) or {}).get("id")
        caught_up = seen.get("phase") == patch.get("phase") and (
            want_id is None or (seen.get("placement") or {}).get("id") == want_id
        )
        if caught_up or now - when > OVERLAY_TTL_S or key not in gangs_:
            del rt.shared.overlay[key]
        else:
            fresh[key] = patch
    pods: list[Mapping[str, Any]] = [p for store in pod_idx.values() for p in store]
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
    rt.shared.worlds.put(rt.shared.version, now, inputs, w)
    return w


def remember_template(rt: Runtime, key: str, body: Mapping[str, Any], now: float) -> None:
    """A ResourceClaimTemplate this replica just created (until its index shows it)."""
    rt.shared.templates[key] = (dict(body), now)


def recent_template(rt: Runtime, key: str, indexed: Mapping[str, Any] | None, now: float) -> Mapping[str, Any] | None:
    """The template as the index shows it, or the one just created when the index still lags behind.

    Without this a replaced template read back stale (old plan) would be replaced again.
    """
    entry = rt.shared.templates.get(key)
    if entry is None:
        return indexed
    body, when = entry
    ann = rs_template.ANNOTATION_HASH
    if now - when > OVERLAY_TTL_S or (
        indexed is not None
        and ((indexed.get("metadata") or {}).get("annotations") or {}).get(ann)
        == ((body.get("metadata") or {}).get("annotations") or {}).get(ann)
    ):
        del rt.shared.templates[key]
        return indexed
    return body


def plan_for(
    rt: Runtime, w: world.World, now: float, max_age_s: float = 0.0
) -> tuple[queue_runner.Plan, snapshot_builder.ClusterView]:
    """The queue plan, reused while nothing indexed changed, and otherwise for as long as it took to build (at
    most ``PLAN_REUSE_MAX_S``; at least ``max_age_s``), so the pass (a second on the loop at 1,000 nodes and
    10,000 claims; rebuilt per gang event it held the loop for minutes, docs/benchmarks.md) takes half of it."""
    cached = rt.shared.plan
    window = max(max_age_s, rt.shared.plan_build_s)
    if cached is not None and (cached[0] == rt.shared.version or time.monotonic() - rt.shared.plan_at < window):
        return cached[1], cached[2]
    started = time.monotonic()
    view = world.cluster_view(w)
    entries = world.entries(w, view)
    compiled = {e.key: world.admit_for(w, e.spec) for e in entries}
    plan = queue_runner.plan(
        entries, view, lambda e: compiled[e.key].predicate, rt.policy, now=now, settings=rt.settings.queue
    )
    rt.metrics.pass_seconds.observe(time.monotonic() - started)
    rt.metrics.queue_depth.set(sum(1 for a in plan.actions.values() if a.kind != "place"))
    rt.shared.plan = (rt.shared.version, plan, view)
    rt.shared.plan_at = time.monotonic()
    rt.shared.plan_build_s = min(PLAN_REUSE_MAX_S, rt.shared.plan_at - started)
    return plan, view


def overlay_entry(written: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """What this replica's cache must show of a gang until its status write comes back: phase and placement.

    A status that leaves ``placement`` out keeps the one the gang holds (``body`` is the gang as
    this reconcile saw it, overlay included): recording None there let a stale cached body
    without a placement turn a ``Placed`` gang back into ``Pending`` one reconcile later.
    """
    placement = written["placement"] if "placement" in written else (body.get("status") or {}).get("placement")
    return {"phase": written.get("phase"), "placement": placement}


async def reconcile_gang(rt: Runtime, key: str, w: world.World, now: float) -> None:
    """Decide and apply for one gang (and release the victims it preempts), under the process lock."""
    if not rt.leading():
        return
    try:
        await _reconcile_gang(rt, key, w, now)
    except kube.NotLeader:
        log.info("lost leadership during a reconcile; the new leader resumes from the API", gang=key)


async def _reconcile_gang(rt: Runtime, key: str, w: world.World, now: float) -> None:
    body = w.gangs.get(key)
    if body is None:
        rt.coalescer.forget(key)
        return
    if (body.get("metadata") or {}).get("deletionTimestamp"):  # being released (gang.handlers): nothing to decide
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
            body,
            w,
            planned=planned,
            domains=lambda: rt.shared.domains.of(w),
            now=now,
            settings=rt.settings,
            imex=rt.shared.imex,
        )
    )
    if outcome.victims:  # every victim pod's eviction dry-run first: a PodDisruptionBudget may refuse it
        outcome = await asyncio.to_thread(reconciler.checked_preemption, rt.writer, body, outcome, w, rt.settings)
    written, _ = await asyncio.to_thread(
        functools.partial(
            reconciler.apply, rt.writer, rt.writer, rt.coalescer, key=key, body=body, outcome=outcome, now=now
        )
    )
    if "phase" in written or outcome.victims:
        log.info(
            "gang decision",
            gang=key,
            previous=(body.get("status") or {}).get("phase", ""),
            phase=outcome.status.get("phase"),
            reason=outcome.status.get("reason"),
            action=getattr(made[0][0].actions.get(key), "kind", None) if made else None,
            victims=list(outcome.victims),
        )
    if written:
        rt.metrics.status_writes.inc()
        rt.metrics.decisions.labels(outcome=str(outcome.status.get("phase", "")).lower()).inc()
        if "phase" in written or "placement" in written:
            rt.shared.overlay[key] = (now, overlay_entry(outcome.status, body))
            rt.touched()
    if outcome.placed_after_s is not None and written.get("placement"):
        rt.metrics.wait_seconds.observe(max(0.0, outcome.placed_after_s))
    for victim in outcome.victims:
        vo = reconciler.victim_outcome(victim, key, w, rt.settings)
        if vo is None:
            continue
        vbody = w.gangs[victim]
        vwritten, _ = await asyncio.to_thread(
            functools.partial(
                reconciler.apply, rt.writer, rt.writer, rt.coalescer, key=victim, body=vbody, outcome=vo, now=now
            )
        )
        rt.metrics.decisions.labels(outcome="preempted").inc()
        log.info("gang preempted", gang=victim, preemptor=key, status_written=bool(vwritten))
        if vwritten:
            rt.shared.overlay[victim] = (now, {"phase": "Preempted", "placement": None})
            rt.touched()


async def sync_node_label(
    rt: Runtime, node: str, node_body: indexed.NodeView | None, slices: Iterable[Mapping[str, Any]]
) -> None:
    """Bring one node's NVLink-domain label in line with its published GPUs."""
    if node_body is None or not rt.leading():
        return
    want = labels.desired(labels.domains_of_node(node, slices))
    patch = labels.patch_for(node_body.labels, node_body.nvlink_domains, want)
    if patch is None:
        return
    await asyncio.to_thread(rt.writer.patch_node, node, patch)
    msg = f"NVLink domain label {names.NODE_LABEL_NVLINK_DOMAIN}={want.label or '(none)'}"
    if want.annotation:
        msg += f"; GPUs in several domains: {want.annotation}"
    ref = events.ObjectRef(
        api_version="v1",
        kind="Node",
        name=node,
        namespace="",
        uid=node_body.uid,
    )
    await asyncio.to_thread(rt.writer.event, ref, "Normal", events.NODE_DOMAIN_LABELLED, msg)
