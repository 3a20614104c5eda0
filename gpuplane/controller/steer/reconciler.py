"""Steering, the I/O side: read the gated pods, run one pass (``decide``), write one patch per pod.

State kept in memory is only what the API cannot say cheaply and what may be
lost: when this replica first saw a pod gated (for the timeout; a new leader
starts counting afresh, bounded by the pod's age), the pods it patched but
whose index entry still shows the gate (so a second pass does not decide them
again), and the shape of released pods still pending (the queue the policy is
told about), the placements it steered until their claims are allocated (the
``gpuplane.dev/steered`` annotation only shows them: a pod's owner can write
it, so it is never read as a reservation), and the pods whose patches failed
(paused, and behind the others). A new leader starts from the API: the gate,
and the namespaces an administrator opted in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

import structlog

from gpuplane.controller import config, kube, steps
from gpuplane.controller.claimtemplate import TemplateView
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.indexed import ClaimView, PodView
from gpuplane.controller.node import snapshot_builder
from gpuplane.controller.steer import decide, gate, shape, writes
from gpuplane.placement import fragmentation, model
from gpuplane.placement.policies import base

log = structlog.get_logger(__name__)

ANNOTATION_STEERED, ANNOTATION_RESULT, MAX_WRITES = (
    writes.ANNOTATION_STEERED,
    writes.ANNOTATION_RESULT,
    writes.MAX_WRITES,
)
patch_for, writes_of = writes.patch_for, writes.writes_of  # steering's own names for them

DECIDED_TTL_S = 30.0
SHAPE_CACHE_SIZE = 256
WRITERS = 8  # patches in flight at once
OPTED_IN_SELECTOR = "gpuplane.dev/steering=enabled"  # the namespace label the steer gate's policy matches
OPTED_IN_TTL_S = 10.0
BACKOFF_FIRST_S = 1.0  # a pod whose patch failed waits this long before it is decided again, doubling
BACKOFF_MAX_S = 60.0
# Namespaces steering never acts in, whatever their labels (kube-system's pods are not a tenant's to move).
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "gpuplane-system"})


class PodWriter(Protocol):
    """The one write steering makes (``KubeWriter.run`` satisfies it)."""

    def run(self, namespace: str, step: steps.Step) -> None:
        """Apply one step; raise on failure."""
        ...


class Meter(Protocol):
    """Where steering reports (``ControllerMetrics`` satisfies it)."""

    @property
    def steer_decisions(self) -> Any:
        """Counter by outcome."""
        ...

    @property
    def steer_seconds(self) -> Any:
        """Histogram of gate time."""
        ...

    @property
    def steer_pass_seconds(self) -> Any:
        """Histogram of pass duration."""
        ...


@dataclass
class SteerState:
    """Per-process memory of the steering loop (cleared when a new leadership term starts)."""

    first_seen: dict[str, float] = field(default_factory=dict)  # pod uid -> time first seen gated
    decided: dict[str, float] = field(default_factory=dict)  # pod uid -> time patched
    shapes: dict[str, fragmentation.Shape] = field(default_factory=dict)  # released pod uid -> its shape
    # Steered pods this replica patched: their placement counts until the claim shows allocated (the
    # annotation in the index and the allocation in the claim cache each arrive a little later).
    reserved: dict[str, tuple[float, str, model.MemberPlacement]] = field(default_factory=dict)
    told: set[str] = field(default_factory=set)  # pods whose wait for the MIG offer is written on them
    # Pods whose patch failed: uid -> (failures so far, not before). A failing pod is decided again only
    # after its pause and goes behind every other pod of a pass, so pods that cannot be written (a tenant's
    # own gate on an oversized pod) never take the writes of the pods that can.
    backoff: dict[str, tuple[int, float]] = field(default_factory=dict)
    # The namespaces opted in to steering (label below, set by an administrator), read at most every
    # OPTED_IN_TTL_S; None until the first read succeeds (no pod is decided before it).
    opted_in: frozenset[str] | None = None
    opted_in_at: float = float("-inf")
    # Shapes by (claim spec, classes, published profiles): every pod of one template shares one entry.
    shape_cache: dict[str, shape.Shape | str] = field(default_factory=dict)
    # Patches are written by a small pool, so a pass holds the lock only while it decides; what it
    # decided is marked and reserved at once (a failed write undoes that, and a later pass retries).
    writers: concurrent.futures.ThreadPoolExecutor | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    inflight: list[concurrent.futures.Future[None]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the steering loop's: a gated pod changed

    def drain(self, timeout: float = 30.0) -> None:
        """Wait for the patches in flight (tests; shutdown)."""
        pending, self.inflight = self.inflight, []
        concurrent.futures.wait(pending, timeout=timeout)

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The write pool (created on first use)."""
        if self.writers is None:
            self.writers = concurrent.futures.ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="steer")
        return self.writers

    @classmethod
    def create(cls, cfg: config.ControllerConfig) -> Self:
        """Nothing seen yet."""
        return cls()

    def new_term(self) -> None:
        """Forget everything (a new term)."""
        with self.lock:
            self._clear()

    def _clear(self) -> None:
        self.first_seen.clear()
        self.decided.clear()
        self.shapes.clear()
        self.reserved.clear()
        self.backoff.clear()
        self.shape_cache.clear()
        self.told.clear()


def allocated_owners(claims: Iterable[ClaimView]) -> set[str]:
    """UIDs of the pods that own an allocated claim (a steered pod's reservation ends there)."""
    return {o.uid for c in claims if c.allocated for o in c.pod_owners}


def reservations(
    pending: Iterable[PodView],
    state: SteerState | None = None,
    claims: Iterable[ClaimView] = (),
    now: float = 0.0,
) -> list[snapshot_builder.Reservation]:
    """Placements this replica steered whose claims are not allocated yet, from its own memory only.

    The ``gpuplane.dev/steered`` annotation on a pod is display, never a reservation: the pod's owner
    can write any annotation (a forged one reserved other tenants' GPUs on any number of nodes), and a
    field manager's name in managedFields is the writer's own choice. What this replica decided is one
    node and the pod's own request shape; a new leader starts without it (the scheduler, which
    allocates, still refuses a double booking: at worst one pod is steered to a node that turns out
    full and waits there as it would without steering). ``pending`` is kept for the callers' shape.
    """
    del pending
    owners = allocated_owners(claims)
    out = []
    if state is not None:
        with state.lock:
            for uid, (when, key, placement) in list(state.reserved.items()):
                if uid in owners or now - when > DECIDED_TTL_S:
                    del state.reserved[uid]
                else:
                    out.append(snapshot_builder.Reservation(f"{decide.RESERVATION_PREFIX}{key}", placement))
    return out


def gated_pods(
    pending: Iterable[PodView],
    state: SteerState,
    settings: decide.Settings,
    now: float,
    opted_in: Collection[str] | None = None,
) -> list[decide.Gated]:
    """Pods held by the gate that this replica may decide now, with when it first saw each.

    Only pods of the namespaces in ``opted_in`` (labelled ``gpuplane.dev/steering=enabled`` by an
    administrator; ``None``: every namespace, for tests), never a system namespace: anyone may put the
    gate on their own pods, and a gated pod elsewhere is not gpuplane's to decide. Not a pod this
    replica has just patched, nor one whose last patch failed less than its backoff ago. Nor a pod whose
    annotations are so close to the API's 256 KiB limit that steering's own could not be added: it would
    reserve a GPU in the pass for a write the API refuses, and hold back the pods after it (issue 32).
    """
    out = []
    live: set[str] = set()
    with state.lock:
        for pod in pending:
            uid = pod.uid
            live.add(uid)
            ns = pod.namespace
            if ns in SYSTEM_NAMESPACES or (opted_in is not None and ns not in opted_in):
                continue
            if not gate.held_by(pod, settings.gate):
                state.decided.pop(uid, None)
                continue
            if pod.annotations_full:  # no patch of ours could be written
                continue
            if uid in state.decided and now - state.decided[uid] < DECIDED_TTL_S:
                continue
            failed = state.backoff.get(uid)
            if failed is not None and now < failed[1]:
                continue
            first = state.first_seen.setdefault(uid, now)
            out.append(decide.Gated(pod.key, pod, first, failed[0] if failed is not None else 0))
        for gone in [u for u in state.first_seen if u not in live]:
            state.first_seen.pop(gone, None)
            state.decided.pop(gone, None)
            state.shapes.pop(gone, None)
            state.told.discard(gone)
        for gone in [u for u in state.backoff if u not in live]:
            state.backoff.pop(gone, None)
    return out


def waiting_shapes(pending: Iterable[PodView], state: SteerState) -> dict[fragmentation.Shape, int]:
    """Shapes of released pods still waiting for the scheduler (what the policy's queue view should hold)."""
    out: dict[fragmentation.Shape, int] = {}
    with state.lock:
        shapes = dict(state.shapes)
    for pod in pending:
        s = shapes.get(pod.uid)
        if s is not None and not pod.node_name:
            out[s] = out.get(s, 0) + 1
    return out


def run_pass(
    writer: PodWriter,
    policy: base.Policy,
    meter: Meter | None,
    state: SteerState,
    settings: decide.Settings,
    *,
    pending: Sequence[PodView],
    view: snapshot_builder.ClusterView,
    claims: Mapping[str, ClaimView],
    templates: Mapping[str, TemplateView],
    classes: Mapping[str, ClassView],
    now: float,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    opted_in: Collection[str] | None = None,
    republishing: frozenset[str] = frozenset(),
) -> list[decide.Action]:
    """Decide every gated pod in ``pending`` and write the patches (blocking; run it in a thread)."""
    started = time.monotonic()
    gated = gated_pods(pending, state, settings, now, opted_in)
    if not gated:
        return []
    inputs = decide.Inputs(
        view, claims, templates, classes, waiting_shapes(pending, state), node_labels or {}, republishing
    )
    actions = decide.decide(
        gated, inputs, policy, now=now, settings=settings, shapes=lambda g: cached_shape(g, inputs, state)
    )
    by_key = {g.key: g for g in gated}
    with state.lock:  # a wait for the MIG offer is written once (its reason), then only decided again
        fresh = [a for a in actions if a.kind != "wait" or by_key[a.key].pod.uid not in state.told]
    todo = writes_of(fresh, {g.key: g.failures for g in gated})
    for action in todo:
        g = by_key[action.key]
        uid = g.pod.uid
        with state.lock:
            if action.kind == "wait":
                state.told.add(uid)
            else:
                state.decided[uid] = now
            if action.kind == "steer" and action.placement is not None:
                state.reserved[uid] = (now, action.key, action.placement)
            if action.kind == "release" and action.outcome == "no-room":
                req = _shape_of_reason(g, inputs, state)
                if req is not None:
                    state.shapes[uid] = req
        patch = _Patch(action, g, uid, patch_for(g.pod, action, settings), started, time.time(), now)
        state.inflight = [f for f in state.inflight if not f.done()]
        state.inflight.append(state.pool().submit(_write, writer, meter, state, patch))
    if meter is not None:
        meter.steer_pass_seconds.observe(time.monotonic() - started)
    return actions


@dataclass(frozen=True)
class _Patch:
    action: decide.Action
    gated: decide.Gated
    uid: str
    body: list[dict[str, Any]]
    started: float  # the pass's start (monotonic)
    decided: float  # wall time the pass decided it (before the write)
    now: float = 0.0  # the pass's clock (a failed write's backoff counts from it)


def _write(writer: PodWriter, meter: Meter | None, state: SteerState, patch: _Patch) -> None:
    """One patch (in the write pool); a failure undoes the pass's marks so a later pass decides again."""
    action, g, uid, body, started = patch.action, patch.gated, patch.uid, patch.body, patch.started
    ns, name = action.key.split("/", 1)
    try:
        writer.run(ns, steps.Step("patch-pod", name, body, why=action.outcome))
    except (kube.StepFailed, kube.NotLeader) as exc:  # pod gone or changed, or no longer leader
        with state.lock:
            failures = _failed(state, uid, patch.now)
            state.shapes.pop(uid, None)
        log.info("steering patch failed", pod=action.key, outcome=action.outcome, error=str(exc), failures=failures)
        return
    except Exception:  # never lose the pool thread
        log.exception("steering patch failed unexpectedly", pod=action.key)
        with state.lock:
            _failed(state, uid, patch.now)
        return
    with state.lock:
        state.backoff.pop(uid, None)
    if meter is not None:
        meter.steer_decisions.labels(outcome=action.outcome).inc()
        if action.kind != "wait":
            meter.steer_seconds.observe(max(0.0, time.time() - g.first_seen))
    log.info(
        {"steer": "steered", "wait": "kept gated"}.get(action.kind, "released from the steering gate"),
        pod=action.key,
        outcome=action.outcome,
        reason=action.reason,
        gated_ms=round(1000 * (time.time() - g.first_seen), 1),
        decided_ms=round(1000 * (patch.decided - g.first_seen), 1),
        write_ms=round(1000 * (time.time() - patch.decided), 1),
        pass_ms=round(1000 * (time.monotonic() - started), 1),
    )


def _failed(state: SteerState, uid: str, when: float) -> int:
    """Undo a pass's marks for a pod whose patch failed and pause it (doubling); under the lock."""
    state.decided.pop(uid, None)
    state.reserved.pop(uid, None)
    state.told.discard(uid)
    failures = state.backoff.get(uid, (0, 0.0))[0] + 1
    state.backoff[uid] = (failures, when + min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (failures - 1)))
    return failures


def cached_shape(g: decide.Gated, inputs: decide.Inputs, state: SteerState) -> shape.Shape | str:
    """``shape.shape_of`` memoised on what it depends on (the claim spec, the classes, the published devices)."""
    spec = shape.claim_spec_of(g.pod, inputs.claims, inputs.templates)
    if isinstance(spec, str):
        return spec
    view = inputs.view
    key = json.dumps(
        [
            spec[0],
            spec[1],
            sorted(inputs.classes.items()),
            len(view.gpus),
            len(view.mig),
            sorted(view.profiles.items()),
        ],
        sort_keys=True,
        default=str,
    )
    got = state.shape_cache.get(key)
    if got is None:
        if len(state.shape_cache) > SHAPE_CACHE_SIZE:
            state.shape_cache.clear()
        got = shape.shape_of(g.pod, spec[0], spec[1], inputs.classes, view)
        state.shape_cache[key] = got
    if isinstance(got, shape.Shape):
        return dataclasses.replace(got, request=dataclasses.replace(got.request, id=g.key))
    return got


def _shape_of_reason(g: decide.Gated, inputs: decide.Inputs, state: SteerState) -> fragmentation.Shape | None:
    got = cached_shape(g, inputs, state)
    return None if isinstance(got, str) else fragmentation.shape_of(got.request)
