"""The leader's IMEX pass: the placed gangs in, the ``ImexDomain`` objects written to match.

:func:`desired` is pure: one copy of the indexes (:class:`gpuplane.controller.gang.world.World`), the GPU ->
NVLink domain map and the objects that exist in, the writes out (:func:`gpuplane.controller.imex.decide.plan`
over :func:`gpuplane.controller.imex.gangs.placed`, rendered and diffed by :mod:`.objects`), with the gangs
and domains refused and why.

:func:`run` is the loop (I/O), started by :func:`register` on kopf's start-up like the controller's other
background loops: after the start-up barrier, while this replica leads, a pass whenever anything indexed
changed since the last one (checked every ``TICK_S``: a claim's allocation, a gang's status, a pod) and every
``RESYNC_S`` regardless (an object edited or deleted by hand comes back). A pass lists the namespace's
objects (one API read), decides on the loop under the process lock (the World is copied there; the plan is
a few dicts per placed gang) and writes in a thread. A failed pass is logged and tried again ``RETRY_S``
later; a lost leadership ends it at its next write. Without the CRD (an older install) it logs once and
writes nothing.

Each pass leaves what it wrote in IMEX's runtime state (:class:`.hold.ImexState` holding a :class:`.hold.Written`:
the claims each gang's domain lists, the gangs refused, whether a write failed or the CRD is not served, each
gang's domain nodes not ready), which the gang reconcile reads to hold a gang's gates until its domain lists
every member claim (:mod:`.hold`) and to release a gang whose domain stays not ready (:mod:`.readiness`).

**Readiness.** Every pass, and while any domain exists a status-only look every ``WATCH_S`` (one list; the
drivers' status writes are not indexed), reads the drivers' reports (:mod:`.readiness`): the Events of what
changed go to every gang of the domain (a node no longer ready, ready again, the domain ready on every node),
and the nodes not ready per gang go into that state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf
import structlog

from gpuplane.api import imex, imex_group
from gpuplane.controller import events, kube, runtime
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.gang import world
from gpuplane.controller.imex import decide, gangs, groups, hold, objects, readiness
from gpuplane.controller.imex.api import ImexApi
from gpuplane.informer.client import ApiError

log = structlog.get_logger(__name__)

TICK_S = 1.0
RESYNC_S = 30.0
RETRY_S = 5.0
WATCH_S = 2.0
MAX_CLAIM_EVENTS = 100


@dataclass(frozen=True)
class Outcome:
    """One pass's decision: the writes, the plan they come from, and what was refused (by gang uid or domain);
    ``listed``: gang uid -> the claim uids its domain object lists; ``gangs_refused``: gang uid -> why none does."""

    diff: objects.Diff
    plan: decide.Plan
    refused: Mapping[str, str]
    listed: Mapping[str, frozenset[str]]
    gangs_refused: Mapping[str, str]
    claim_events: tuple[groups.Refusal, ...] = ()  # IMEX groups' claims refused (Warnings on the claims)

    def written(
        self, at: float, failed: str = "", unready: Mapping[str, Mapping[str, str]] | None = None
    ) -> hold.Written:
        """What the API holds once this outcome's diff is applied (``failed``: why it may not)."""
        return hold.Written(at=at, failed=failed, listed=self.listed, refused=self.gangs_refused, unready=unready or {})


def desired(w: world.World, gpu_domains: Mapping[str, str], existing: Sequence[Mapping[str, Any]]) -> Outcome:
    """What to write so that the objects match the gangs placed in ``w`` and its IMEX groups (:mod:`.groups`)."""
    channels = gangs.recorded_channels(existing)
    placed = gangs.placed(w, gpu_domains, channels)
    grouped = groups.gather(w, gangs.node_cliques(gpu_domains), channels, w.claim_gangs)
    members = {**placed.members, **grouped.members}
    plan = decide.plan(placed.gangs + grouped.gangs)
    rendered = objects.render(plan, members, addresses=w.addresses)
    listed: dict[str, frozenset[str]] = {}
    gangs_refused = dict(plan.refused)
    for domain in plan.domains:
        for uid in domain.gangs:
            if domain.name in rendered.refused:
                gangs_refused[uid] = rendered.refused[domain.name]
            else:
                listed[uid] = frozenset(c.uid for c in members[uid].claims)
    refused = {**plan.refused, **rendered.refused}
    told = (*grouped.refusals, *groups.plan_refusals(gangs_refused, members))
    return Outcome(objects.diff(rendered.objects, existing), plan, refused, listed, gangs_refused, told)


class Pass:
    """One leader's passes: what it last saw, so that a pass runs only on a change, and refusals are logged once."""

    def __init__(
        self,
        rt: runtime.Runtime,
        world_of: Callable[[], world.World],
        api: ImexApi,
        recorder: events.Recorder | None = None,
    ) -> None:
        self.rt = rt
        self.recorder = recorder or rt.writer  # the gangs' readiness Events
        self.world_of = world_of
        self.api = api
        self.version: int | None = None
        self.at = 0.0
        self.refused: Mapping[str, str] = {}
        self.unserved = False
        self.retry_at = 0.0  # after a failed pass: not before then (a failing API is not asked every tick)
        self.states: dict[str, dict[str, readiness.NodeState]] = {}  # domain -> node states, as last read
        self.domains = 0  # how many objects the last read listed
        self.looked_at = 0.0
        self.claims_told: frozenset[groups.Refusal] = frozenset()  # each told once while it holds

    def tell_claims(self, refusals: Sequence[groups.Refusal]) -> None:
        """A Warning on each claim refused that was not refused for the same reason last pass (at most
        ``MAX_CLAIM_EVENTS`` a pass: the rest wait for the next)."""
        new = [r for r in dict.fromkeys(refusals) if r not in self.claims_told][:MAX_CLAIM_EVENTS]
        for r in new:
            ref = events.ObjectRef("resource.k8s.io/v1", "ResourceClaim", r.name, r.namespace, r.uid)
            self.recorder.event(ref, "Warning", r.reason, r.message)
            log.warning("IMEX group refused", claim=f"{r.namespace}/{r.name}", reason=r.reason, why=r.message)
        self.claims_told = frozenset(r for r in refusals if r in self.claims_told) | frozenset(new)

    def due(self, now: float) -> bool:
        return now >= self.retry_at and (self.version != self.rt.shared.version or now - self.at >= RESYNC_S)

    def watch_due(self, now: float) -> bool:
        """A status-only look: domains exist and the last read is ``WATCH_S`` old."""
        return self.domains > 0 and now >= self.retry_at and now - self.looked_at >= WATCH_S

    async def read_status(self, existing: Sequence[Mapping[str, Any]], now: float) -> dict[str, dict[str, str]]:
        """The drivers' reports in ``existing``: Events for what changed, and each gang's nodes not ready."""
        parsed = [d for d in (imex.parse_domain(o)[0] for o in existing) if d is not None]
        self.states, told = readiness.advance(self.states, parsed)
        self.domains, self.looked_at = len(existing), now
        if told:
            await asyncio.to_thread(self._tell, told)
        return readiness.unready_by_gang(parsed)

    def _tell(self, told: Sequence[readiness.GangEvent]) -> None:
        for e in told:
            if imex_group.is_group(e.gang.uid):  # no object to tell; its pods' prepare Events say it
                log.info("IMEX readiness", group=f"{e.gang.namespace}/{e.gang.name}", reason=e.reason, why=e.message)
                continue
            ref = events.ObjectRef("gpuplane.dev/v1alpha1", "GpuGang", e.gang.name, e.gang.namespace, e.gang.uid)
            self.recorder.event(ref, e.type, e.reason, e.message)
            log.info("IMEX readiness told", gang=f"{e.gang.namespace}/{e.gang.name}", reason=e.reason, why=e.message)

    async def look(self, now: float) -> None:
        """Between passes: the status only (one list), into the IMEX state's ``unready``. A failure is logged and
        changes nothing else (the plan the last pass wrote still holds)."""
        try:
            existing = await asyncio.to_thread(self.api.existing)
            unready = await self.read_status(existing, now)
        except ApiError as exc:
            log.warning("IMEX status look failed; retrying", status=exc.status, reason=exc.reason)
            self.looked_at = now
            return
        current = self.rt.state(hold.ImexState).written
        if current is not None:
            self.rt.state(hold.ImexState).written = dataclasses.replace(current, unready=unready)

    async def once(self, now: float) -> objects.Diff | None:
        """One pass (None: the API does not serve ImexDomains to this controller)."""
        version = self.rt.shared.version
        try:
            existing = await asyncio.to_thread(self.api.existing)
        except ApiError as exc:
            if exc.status not in (403, 404):
                raise
            if not self.unserved:
                log.warning("ImexDomains not served or not readable; no IMEX plan is written", status=exc.status)
            self.unserved = True
            self.rt.state(hold.ImexState).written = hold.Written(at=time.time(), served=False)
            self.version, self.at = version, now
            return None
        self.unserved = False
        unready = await self.read_status(existing, now)
        async with self.rt.lock():
            w = self.world_of()
            outcome = desired(w, self.rt.state(gang_run.GangState).domains.of(w), existing)
        if outcome.claim_events or self.claims_told:
            await asyncio.to_thread(self.tell_claims, outcome.claim_events)
        d = outcome.diff
        if d.create or d.update or d.delete:
            failed = await asyncio.to_thread(self.api.apply, d)
            log.info(
                "IMEX domains written",
                created=[objects_name(o) for o in d.create],
                updated=[objects_name(o) for o in d.update],
                deleted=list(d.delete),
                channels=dict(outcome.plan.channels),
                failed=failed[:10],
            )
            if failed:  # tried again after RETRY_S; meanwhile no gang waits for a plan the API does not hold
                why = f"the IMEX plan could not be written: {failed[0]}"
                self.rt.state(hold.ImexState).written = outcome.written(time.time(), why, unready)
                self.retry_at = now + RETRY_S
                return d
        self.rt.state(hold.ImexState).written = outcome.written(time.time(), unready=unready)
        self.domains = len(existing) + len(d.create) - len(d.delete)  # what the status looks will find
        for created in d.create:  # seen with nothing reported: its first report (ready) is told
            self.states.setdefault(objects_name(created), {})
        if outcome.refused != self.refused:
            for what, why in sorted(outcome.refused.items()):
                log.warning("IMEX: refused", what=what, why=why)
            self.refused = outcome.refused
        self.version, self.at = version, now
        return d


def objects_name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


async def run(rt: runtime.Runtime, world_of: Callable[[], world.World], tick_s: float = TICK_S) -> None:
    """Forever, once the informers synced: a pass when one is due and this replica leads."""
    await rt.caches.wait_synced()
    one = Pass(rt, world_of, ImexApi(rt.writer))
    first = True  # the first pass right away: gangs placed meanwhile wait for it (hold.decide)
    while True:
        if not first:
            await asyncio.sleep(tick_s)
        first = False
        if not rt.leading():
            one.version, one.states = None, {}  # a new term starts with a pass, and tells only what it sees change
            continue
        now = time.monotonic()
        try:
            if one.due(now):
                await one.once(now)
            elif one.watch_due(now):
                await one.look(now)
            else:
                continue
        except kube.NotLeader:
            continue
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("IMEX pass failed; the next one runs in a moment")
            failed = f"the IMEX pass failed: {type(exc).__name__}"
            rt.state(hold.ImexState).written = hold.Written(at=time.time(), failed=failed)
            one.retry_at = now + RETRY_S


def register(reg: kopf.OperatorRegistry) -> None:
    """The loop's start on ``reg`` (the World from the informers' indexes, ``gang.run.world_now``)."""

    @kopf.on.startup(registry=reg)
    async def start_imex(memo: runtime.Runtime, **_: Any) -> None:
        memo.shared.tasks.append(asyncio.create_task(run(memo, lambda: gang_run.world_now(memo))))
