"""GpuGangs: reconciled from the gang work queue (every change and every resync), released on deletion by kopf.

Thin: each entry point translates its arguments and calls :mod:`.run`. The
gang informer (:mod:`gpuplane.controller.caches`) queues a gang's key on every event and the resync
loop queues every gang every ``--resync`` seconds; :func:`reconcile` is the queue's worker.

Deletion is kopf's ``on.delete`` handler (kopf's finalizer holds the gang until the handler succeeds).
Releasing from the watch's ``DELETED`` event instead, as before, was an edge nobody repeats: a gang
deleted while no replica led (the leader killed, the standby not yet holding the Lease) left its member pods
running on claims and on
an IMEX channel whose domain was torn down. Now the deletion waits, ``Terminating``, until a leader
with complete indexes has released what is left of the gang; a standby answers "not yet"
(:class:`kopf.TemporaryError`) and kopf asks again, so whichever replica leads next does it. The
release is idempotent (what is gone already is not written again), and a write that keeps failing
gives up after :data:`GIVE_UP_S` with a Warning Event on the gang, so no gang is held forever by a
pod the controller may not delete. With no controller running at all, a deleted gang stays
``Terminating`` until one runs (docs/operations.md says how to let it go by hand).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
import structlog

from gpuplane.controller import names, rejects, runtime
from gpuplane.controller.gang import deleted, desired, run, world
from gpuplane.controller.gang import view as gang_view
from gpuplane.controller.gang.view import GangView

log = structlog.get_logger(__name__)

RETRY_S = 2.0  # a standby's (or a replica's still indexing) "ask again in"
GIVE_UP_S = 300.0  # a release whose writes keep failing lets the gang go after this long

WorldOf = Callable[[runtime.Runtime], world.World]  # the caches' World now (run.world_now)


async def reconcile(rt: runtime.Runtime, key: str, world_of: WorldOf) -> None:
    """Reconcile gang ``key`` (the gang work queue's worker: on every change and every resync)."""
    if not rt.leading():  # a standby only keeps its caches warm
        return
    async with rt.lock():
        await run.reconcile_gang(rt, key, world_of(rt), time.time())


def register(reg: kopf.OperatorRegistry, world_of: WorldOf) -> None:
    """The GpuGang deletion handler on ``reg`` (kopf's finalizer holds a deleted gang until it returns)."""

    @kopf.on.delete(names.GROUP, names.VERSION, names.GANG_PLURAL, optional=False, registry=reg)
    async def gang_release(body: kopf.Body, namespace: str | None, name: str, memo: Any, **kw: Any) -> None:
        elapsed: datetime.timedelta = kw["runtime"]  # kopf's: since the first attempt at this deletion
        await release(memo, f"{namespace}/{name}", body, lambda: world_of(memo), elapsed.total_seconds())


async def release(
    rt: runtime.Runtime, key: str, body: Mapping[str, Any], world_now: Callable[[], world.World], elapsed_s: float
) -> None:
    """Release deleted gang ``key`` or raise :class:`kopf.TemporaryError` (kopf keeps its finalizer and asks
    again); returning lets kopf remove the finalizer. ``elapsed_s``: since the first attempt."""
    if rejects.rejected(body):  # unreadable: never placed, nothing to release
        return
    gang = gang_view.view(body)
    if not rt.leading() or not rt.caches.synced():
        raise kopf.TemporaryError("the leader releases a deleted gang, on complete indexes", delay=RETRY_S)
    async with rt.lock():
        released = await release_deleted_gang(rt, key, gang, world_now())
    if released.not_leading:
        raise kopf.TemporaryError("lost the lease while releasing; the next leader resumes", delay=RETRY_S)
    if released.failed and elapsed_s < GIVE_UP_S:
        raise kopf.TemporaryError(f"release writes failed: {'; '.join(released.failed[:3])}", delay=RETRY_S)
    if released.failed:
        await gang_release_abandoned(rt, key, gang, released.failed)


def gang_gone(rt: runtime.Runtime, key: str) -> None:
    """A GpuGang left the API (released first, :func:`release_deleted_gang`): drop what this replica caches of it."""
    gs = rt.state(run.GangState)
    gs.coalescer.forget(key)
    gs.overlay.pop(key, None)


@dataclass(frozen=True)
class Released:
    """What one attempt at releasing a deleted gang left undone."""

    failed: tuple[str, ...] = ()  # writes that failed, as text
    not_leading: bool = False  # not the leader (any more): nothing was decided


async def release_deleted_gang(rt: runtime.Runtime, key: str, gang: GangView, w: world.World) -> Released:
    """A GpuGang is being deleted: release what is left of it and tell its pods (:mod:`.gang.deleted`).

    Idempotent: members already deleted and claims already gone are not written again, so a
    replica that leads next repeats it safely."""
    if not rt.leading():
        return Released(not_leading=True)
    gang_gone(rt, key)  # its status writes and overlay go now; the DELETED event repeats it on every replica
    ns, name = key.split("/", 1)
    ref = desired.GangRef(ns, name, gang.uid)
    phase = gang.phase
    owned = [c for c, e in w.gang_claims(key).items() if e.owned]
    grace = rt.cfg.eviction_grace_s
    d = deleted.deletion(ref, phase, w.pods.get(key, ()), owned, w.jobs.get(key, ()), grace_seconds=grace)
    if not d.steps and not d.told:
        return Released()
    failed = await asyncio.to_thread(deleted.end, rt.writer, rt.writer, ns, d)
    rt.touched()
    log.info("gang deleted: released", gang=key, phase=phase, pods_told=d.pods_told, steps=len(d.steps))
    if failed:
        log.warning("some writes for a deleted gang failed; retrying", gang=key, failed=failed[:10])
    return Released(failed=tuple(failed), not_leading=not rt.leading())


async def gang_release_abandoned(rt: runtime.Runtime, key: str, gang: GangView, failed: Iterable[str]) -> None:
    """A deleted gang's release kept failing: say so on the gang and let it go."""
    what = "; ".join(list(failed)[:5])
    ref = gang.ref
    text = (
        f"GpuGang {key} was deleted but some of its release kept failing ({what}); the gang is let go. "
        "Delete what is left of its member pods and claims by hand (kubectl get pods,resourceclaims "
        f"-l {names.LABEL_GANG}={key.split('/', 1)[1]})"
    )
    await asyncio.to_thread(rt.writer.event, ref, "Warning", deleted.ABANDONED, text)
    log.error("gang deleted: release abandoned", gang=key, failed=what)
