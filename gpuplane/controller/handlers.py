"""kopf registrations: indexes of what the controller reads, and thin handlers that delegate.

Every handler translates kopf's arguments into plain data and calls one
function of :mod:`gpuplane.controller.runtime`; none fetches, parses, decides and
writes by itself. The registry is built by :func:`make_registry` (no
module-level registry, so tests and main() each get their own).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import kopf

from gpuplane.api import names as dn
from gpuplane.controller import config, heap, indexed, kopf_barrier, names, rejects, runtime, slim, startup, steering
from gpuplane.controller import fleet_gauges as gauges
from gpuplane.controller.claim import checks, explainer, handling, review
from gpuplane.controller.gang import handlers as gang_handlers
from gpuplane.controller.gang import leaderworkersets, owners
from gpuplane.controller.imex import reconcile as imex
from gpuplane.controller.node import slice_index, untrusted
from gpuplane.controller.rebalance import act, decide, loop
from gpuplane.controller.rightsize import apply as rightsize
from gpuplane.controller.rightsize import template as rs_template
from gpuplane.controller.steer import decide as steer_decide
from gpuplane.controller.steer import gate as steer_gate

RESOURCE = ("resource.k8s.io", "v1")
LIST_CHUNK = 100
WORKER_IDLE_S = 0.5


# What an index handler returns for an object it does not index. Not None: kopf (1.45,
# ``OperatorIndexers.replace``) keeps an object's earlier entry when its handler returns None, so a
# pod indexed while pending stayed in ``pending_pod_idx`` (a deep copy of its spec) after it was
# bound, until it was deleted: about 3,000 stale pods, 40 MB, in a leader that lived through fleet
# run 10. An empty mapping replaces the entry with nothing. Never mutated.
NOT_INDEXED: Mapping[str, Any] = MappingProxyType({})


def _dropped(memo: Any) -> Mapping[str, Any]:
    """An object that was readable and is now quarantined leaves the index: a change the plan must see."""
    memo.touched()
    return NOT_INDEXED


def _plain(body: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: copy.deepcopy(body[k]) for k in ("apiVersion", "kind", "metadata", *keys) if k in body}


def make_registry(cfg: config.ControllerConfig) -> kopf.OperatorRegistry:
    """Every index and handler of the controller on a fresh registry."""
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
        # An object's worker exits this soon after its last event (kopf: 5 s), instead of holding its last
        # body meanwhile: a start-up listing of 20,000 objects kept thousands of them alive at once.
        settings.queueing.idle_timeout = WORKER_IDLE_S
        # The first listing of every resource in pages, never one response holding a fleet's slices.
        settings.watching.chunk_size = LIST_CHUNK
        # Other drivers' slices never reach this process (the API server filters them).
        settings.watching.field_selectors[RESOURCE[0], "resourceslices"] = f"spec.driver={dn.DRIVER_NAME}"

    # --- indexes (the read side: caches of API state) ----------------------------------------------
    @kopf.index(names.GROUP, names.VERSION, names.GANG_PLURAL, id="gang_idx", registry=reg)
    def gang_idx(body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any) -> Mapping[str, Any]:
        if rejects.rejected(body):  # nested too deeply to read: no decision may see it
            return _dropped(memo)
        memo.touched()
        return {f"{namespace}/{name}": _plain(body, "spec", "status")}

    @kopf.index("pods", labels={names.LABEL_GANG: kopf.PRESENT}, id="member_pod_idx", registry=reg)
    def member_pod_idx(body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any) -> Mapping[str, Any]:
        if rejects.rejected(body):
            return _dropped(memo)
        memo.touched()
        return {f"{namespace}/{name}": _plain(body, "spec", "status")}

    @kopf.index("pods", id="claim_consumer_idx", registry=reg)
    def claim_consumer_idx(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Mapping[str, str]:
        refs = [r.get("resourceClaimName") for r in (body.get("spec") or {}).get("resourceClaims") or []]
        refs += [s.get("resourceClaimName") for s in (body.get("status") or {}).get("resourceClaimStatuses") or []]
        return {f"{namespace}/{r}": name for r in refs if r}

    @kopf.index(*RESOURCE, "resourceclaims", id="claim_idx", registry=reg)
    def claim_idx(body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any) -> Mapping[str, Any]:
        if rejects.rejected(body):
            return _dropped(memo)
        memo.touched()
        return {f"{namespace}/{name}": indexed.claim(body)}

    interner = slice_index.Interner()  # one copy of each distinct MIG device for the whole fleet

    @kopf.index(*RESOURCE, "resourceslices", id="slice_idx", registry=reg)
    def slice_idx(body: kopf.Body, name: str, memo: runtime.Runtime, **_: Any) -> Mapping[str, Any]:
        if rejects.rejected(body):  # nested too deeply to read: no decision may see it
            return _dropped(memo)
        slimmed, digest = slim.digest_of(body)  # kopf_decoding digested it as it was decoded
        if not slimmed:
            digest = slice_index.digest(name, body.get("spec") or {}, interner)
        if digest is None:
            if (reason := slice_index.untrusted(body.get("spec"))) is not None:  # its pool is not its node's
                untrusted.report(memo.metrics, name, body.get("spec") or {}, reason)
                return _dropped(memo)
            return NOT_INDEXED
        memo.touched()
        return {digest.node: digest}  # keyed by node: a node's label needs only its own slices

    @kopf.index("nodes", id="node_idx", registry=reg)
    def node_idx(body: kopf.Body, name: str, memo: runtime.Runtime, **_: Any) -> Mapping[str, Any]:
        if rejects.rejected(body):
            return _dropped(memo)
        memo.touched()
        return {name: indexed.node(body)}

    @kopf.index(*RESOURCE, "deviceclasses", id="class_idx", registry=reg)
    def class_idx(body: kopf.Body, name: str, memo: runtime.Runtime, **_: Any) -> Mapping[str, Any]:
        if rejects.rejected(body):
            return _dropped(memo)
        memo.touched()
        # Not deep-copied like the other indexes: slices are the largest objects and the most frequent
        # events (the steered layout rewrites a few per prepare), and nothing here mutates them.
        return {name: {"metadata": dict(body.get("metadata") or {}), "spec": body.get("spec") or {}}}

    @kopf.index(*RESOURCE, "resourceclaimtemplates", id="claim_template_idx", registry=reg)
    def claim_template_idx(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Mapping[str, Any]:
        return {f"{namespace}/{name}": _plain(body, "spec")}

    @kopf.index("pods", id="pending_pod_idx", registry=reg)
    def pending_pod_idx(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Mapping[str, Any]:
        spec = body.get("spec") or {}
        if (
            spec.get("nodeName")
            or not spec.get("resourceClaims")
            or (body.get("metadata") or {}).get("deletionTimestamp")
        ):
            return NOT_INDEXED
        return {f"{namespace}/{name}": indexed.pending_pod(body)}  # bounded: no tenant-sized fields

    def makes_members(body: kopf.Body, **_: Any) -> bool:
        return owners.gang_of_job(body) is not None

    @kopf.index("batch", "v1", "jobs", id="gang_job_idx", when=makes_members, registry=reg)
    def gang_job_idx(body: kopf.Body, memo: runtime.Runtime, **_: Any) -> Mapping[str, Any]:
        key = owners.gang_of_job(body)
        if key is None:
            return NOT_INDEXED
        memo.touched()
        return {key: _plain(body, "spec", "status")}

    def makes_lws_members(body: kopf.Body, **_: Any) -> bool:
        return leaderworkersets.gang_of(body) is not None

    lws_resource = (leaderworkersets.GROUP, leaderworkersets.VERSION, leaderworkersets.PLURAL)

    @kopf.index(*lws_resource, id="gang_lws_idx", when=makes_lws_members, registry=reg)
    def gang_lws_idx(body: kopf.Body, memo: runtime.Runtime, **_: Any) -> Mapping[str, Any]:
        key = leaderworkersets.gang_of(body)
        if key is None:
            return NOT_INDEXED
        memo.touched()
        return {key: _plain(body, "spec", "status")}

    def world_of(memo: runtime.Runtime, kw: Mapping[str, Any]) -> Any:
        return runtime.make_world(
            memo,
            gang_idx=kw["gang_idx"],
            job_idx=kw["gang_job_idx"],
            lws_idx=kw["gang_lws_idx"],
            pod_idx=kw["member_pod_idx"],
            claim_idx=kw["claim_idx"],
            slice_idx=kw["slice_idx"],
            node_idx=kw["node_idx"],
            class_idx=kw["class_idx"],
            now=time.time(),
        )

    imex.register(reg, world_of)  # the leader's IMEX plan objects, from the placed gangs (issue 35)

    # --- gangs: reconcile, resync, and release on deletion (kopf's finalizer holds it until then) ----------
    gang_handlers.register(reg, world_of, cfg.resync_s)

    # --- gate-and-steer (single pods with a claim, gated at admission) ----------------------------------
    def steer_gated(body: kopf.Body, **_: Any) -> bool:
        return steer_gate.held_by(body, steer_decide.Settings().gate)

    async def steer_once(memo: runtime.Runtime, kw: Mapping[str, Any]) -> None:
        async with memo.lock():
            pending = list(indexed.single(kw["pending_pod_idx"]).values())
            templates = indexed.single(kw["claim_template_idx"])
            labels = steering.node_labels(indexed.single(kw["node_idx"]))
            await steering.steer_pass(
                memo, world_of(memo, kw), pending=pending, templates=templates, now=time.time(), node_labels=labels
            )

    async def steer_loop(memo: runtime.Runtime) -> None:
        """One loop per process: a pass whenever a gated pod changed, and every resync period while any is."""
        shared = memo.shared
        await kopf_barrier.wait_indexed()  # no decision on half-built indexes
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shared.steer_wake.wait(), timeout=cfg.resync_s)
            shared.steer_wake.clear()
            kw = shared.steer_kw
            if kw is None or not memo.leading():
                continue
            try:
                await steer_once(memo, kw)
            except Exception:  # the loop must outlive any one pass
                logging.getLogger(__name__).exception("steering pass failed; retrying on the next wake")

    @kopf.on.event("pods", when=steer_gated, registry=reg)
    async def steer_event(type: str, memo: Any, **kw: Any) -> None:
        # Cheap: remember the (live) indexes, wake the loop, which coalesces any number of these.
        if type not in ("ADDED", "MODIFIED", None):
            return
        shared = memo.shared
        shared.steer_kw = kw
        shared.steer_wake.set()
        if shared.steer_task is None or shared.steer_task.done():
            shared.steer_task = asyncio.create_task(steer_loop(memo))

    # --- NVLink domain labels --------------------------------------------------------------------
    async def label(node: str, memo: runtime.Runtime, kw: Mapping[str, Any]) -> None:
        if not kopf_barrier.indexed():  # start-up: labelled once from the complete indexes (startup.replay)
            memo.shared.deferred.node(node)
            return
        entry = next(iter(kw["node_idx"].get(node, ())), None)
        await runtime.sync_node_label(memo, node, entry, list(kw["slice_idx"].get(node, ())))

    @kopf.on.event(*RESOURCE, "resourceslices", registry=reg)
    async def slice_event(body: kopf.Body, memo: runtime.Runtime, **kw: Any) -> None:
        spec = body.get("spec") or {}
        if spec.get("driver") == dn.DRIVER_NAME and spec.get("nodeName"):
            await label(str(spec["nodeName"]), memo, kw)

    @kopf.on.event("nodes", registry=reg)
    async def node_event(name: str, type: str | None, memo: runtime.Runtime, **kw: Any) -> None:
        if type in ("ADDED", "MODIFIED", None):
            await label(name, memo, kw)

    @kopf.on.startup(registry=reg)
    async def start_replay(memo: runtime.Runtime, **kw: Any) -> None:
        async def check(key: str, body: dict[str, Any], rejected: bool) -> None:
            consumers = list(kw["claim_consumer_idx"].get(key, []))
            classes = indexed.single(kw["class_idx"])
            if rejected:
                await rejects.refuse_claim(memo, body, classes, consumers)
            else:
                await handling.check_claim(memo, body, classes, consumers)

        replay = startup.replay(
            memo.shared.deferred, lambda n: label(n, memo, kw), check, startup.exists_in(kw["claim_idx"])
        )
        memo.shared.tasks.append(asyncio.create_task(replay))

    # --- ResourceClaims --------------------------------------------------------------------------
    @kopf.on.event(*RESOURCE, "resourceclaims", registry=reg)
    async def claim_event(body: kopf.Body, namespace: str | None, name: str, type: str, memo: Any, **kw: Any) -> None:
        if type == "DELETED":
            return
        if not kopf_barrier.indexed():  # start-up: checked once the indexes are complete (startup.replay)
            rejected = rejects.rejected(body)
            kept = dict(body) if rejected else review.essentials(body)  # not a copy of every claim at once
            memo.shared.deferred.claim(f"{namespace}/{name}", kept, rejected=rejected)
            return
        consumers = [p for store in [kw["claim_consumer_idx"].get(f"{namespace}/{name}", [])] for p in store]
        classes = indexed.single(kw["class_idx"])
        if rejects.rejected(body):
            await rejects.refuse_claim(memo, body, classes, consumers)
            return
        await handling.check_claim(memo, _plain(body, "spec", "status"), classes, consumers)

    # Pending claims are explained by a loop over the claim index, not a kopf timer: kopf would keep
    # the last body of every claim for a timer on claims (gpuplane.controller.claim.explainer). The fleet's
    # gauges (pending claims, the largest free block) have a loop of their own, started here too.
    @kopf.on.startup(registry=reg)
    async def start_claim_explainer(memo: runtime.Runtime, **kw: Any) -> None:
        def begin() -> explainer.Explain:  # once per pass: the classes and the world, copied once
            classes, w = indexed.single(kw["class_idx"]), world_of(memo, kw)

            async def explain(claim: Mapping[str, Any], now: float) -> None:
                if rejects.rejected(claim) or not checks.is_ours(claim, classes):
                    return
                async with memo.lock():
                    await handling.explain_claim(memo, claim, classes, w, now)

            return explain

        memo.shared.tasks.append(
            asyncio.create_task(
                explainer.run(kw["claim_idx"], begin, memo.leading, max(cfg.claim_explain_after_s, 5.0))
            )
        )
        fleet = gauges.run(memo, lambda: world_of(memo, kw), kw["claim_consumer_idx"], cfg.fleet_gauges_interval_s)
        memo.shared.tasks.append(asyncio.create_task(fleet))  # on every replica: the operator's alerts read them

    # --- GpuRequests (right-sizing) -----------------------------------------------------------
    @kopf.index(
        *RESOURCE,
        "resourceclaimtemplates",
        labels={rs_template.LABEL_REQUEST: kopf.PRESENT},
        id="template_idx",
        registry=reg,
    )
    def template_idx(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> Mapping[str, Any]:
        return {f"{namespace}/{name}": _plain(body, "spec")}

    async def gpu_request(body: kopf.Body, memo: runtime.Runtime, kw: Mapping[str, Any]) -> None:
        if not memo.leading():
            return
        plain = _plain(body, "spec", "status")
        meta = plain.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        async with memo.lock():
            existing = indexed.single(kw["template_idx"]).get(key)
            await rightsize.reconcile(
                memo.writer,
                plain,
                runtime.recent_template(memo, key, existing, time.time()),
                slice_index.every(kw["slice_idx"]),  # keyed by node: every node's slices, not one each
                indexed.single(kw["class_idx"]),
                created=lambda t: runtime.remember_template(memo, key, t, time.time()),
            )

    @kopf.on.event(names.GROUP, names.VERSION, rs_template.PLURAL, registry=reg)
    async def gpu_request_event(body: kopf.Body, type: str, memo: Any, **kw: Any) -> None:
        if type in ("ADDED", "MODIFIED"):
            await gpu_request(body, memo, kw)

    @kopf.timer(names.GROUP, names.VERSION, rs_template.PLURAL, interval=cfg.rightsize_resync_s, registry=reg)
    async def gpu_request_timer(body: kopf.Body, memo: Any, **kw: Any) -> None:
        await gpu_request(body, memo, kw)

    # --- rebalancing: noisy neighbours ---------------------------------------------------------
    @kopf.on.startup(registry=reg)
    async def start_rebalancer(memo: runtime.Runtime, **kw: Any) -> None:
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
        memo.shared.tasks.append(
            asyncio.create_task(
                loop.run(rebalancer, memo.leading, kw["slice_idx"], kw["claim_idx"], cfg.rebalance_interval_s)
            )
        )

    @kopf.on.startup(registry=reg)
    async def start_heap_trim(memo: runtime.Runtime, **_: Any) -> None:
        memo.shared.tasks.append(asyncio.create_task(heap.trim_loop(kopf_barrier.wait_indexed)))

    @kopf.on.cleanup(registry=reg)
    async def stop_tasks(memo: runtime.Runtime, **_: Any) -> None:
        for task in memo.shared.tasks:
            task.cancel()
        memo.shared.tasks.clear()

    return reg
