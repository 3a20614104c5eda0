"""One rebalancing pass: decide on every alert, move or report, and keep the moves' records. Does I/O.

For an alert :func:`~gpuplane.controller.rebalance.decide.decide` lets through, the offender's pod
is looked up and:

* a pod with a controller (ReplicaSet, StatefulSet, Job, ...) is **evicted through the Eviction
  API**, so every PodDisruptionBudget applies; the DeviceTaintRule that keeps its replacement off
  the GPU is created first (:mod:`gpuplane.controller.rebalance.moves`) and deleted again when the
  eviction is refused;
* a bare pod (no controller: nothing would bring it back) is not evicted, only reported;
* a claim used by several pods is not moved (evicting one would not free the GPU);
* the eviction is pinned to the uid of the pod the claim names as its consumer
  (``deleteOptions.preconditions.uid``): a pod made again under the same name is never evicted;
* without the DeviceTaintRule API (DRADeviceTaintRules off) nothing is moved: the replacement
  could land on the same GPU again.

Every outcome is an Event on the offender's pod and claim and on the higher-tier neighbours'
claims and pods, and a log line with the figures; an outcome that is only reported is reported
once per alert (the controller's memory), and a refused eviction is tried again after a cool-down.
The annotation :data:`ANNOTATION` on the offender's claim shows the last outcome to its owner; it
is display only and never read back: a tenant can write its own claim, so what it holds must not
suppress or redirect a decision. A restarted or new leader may report an outcome once more.
Each pass also charges finished moves to the ledger (their replacement runs) and deletes the rules
whose cool-down is over.

Tiers are read with the namespaces' labels (:mod:`gpuplane.controller.rebalance.entitlement`), listed
once in a pass that has an alert; the cluster-wide eviction budget counts the evictions of the moves'
DeviceTaintRules (in the API: a new leader honours them) and of this replica's memory (the rules go
at the end of their cool-down).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from gpuplane.controller import events, indexed
from gpuplane.controller.metrics import ControllerMetrics
from gpuplane.controller.rebalance import moves, signal
from gpuplane.controller.rebalance.decide import Decision, LastMove, Settings, decide
from gpuplane.informer.client import ApiError

log = structlog.get_logger(__name__)

ANNOTATION = "gpuplane.dev/noisy-neighbour-decision"
EVICTED = "NoisyNeighbourEvicted"
MOVED = "NoisyNeighbourMoved"
NOT_MOVED = "NoisyNeighbourNotMoved"
REPLACED = "NoisyNeighbourReplaced"
CLAIM_API = "resource.k8s.io/v1"


class Writer(Protocol):
    """What a rebalancing pass reads and writes (gpuplane.controller.kube.KubeWriter)."""

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list_pods(self, namespace: str) -> list[dict[str, Any]]: ...
    def evict_pod(self, namespace: str, name: str, uid: str) -> str | None: ...
    def namespace_labels(self) -> dict[str, dict[str, str]]: ...
    def list_device_taint_rules(self, label: str) -> list[dict[str, Any]] | None: ...
    def create_device_taint_rule(self, body: Mapping[str, Any]) -> None: ...
    def delete_device_taint_rule(self, name: str) -> None: ...
    def annotate_device_taint_rule(self, name: str, annotations: Mapping[str, str]) -> None: ...
    def annotate_claim(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...
    def event(self, ref: events.ObjectRef, kind: events.EventType, reason: str, message: str) -> None: ...


def _pod_ref(namespace: str, name: str, uid: str) -> events.ObjectRef:
    return events.ObjectRef("v1", "Pod", name, namespace, uid)


def _claim_ref(t: signal.Tenant) -> events.ObjectRef:
    return events.ObjectRef(CLAIM_API, "ResourceClaim", t.name, t.namespace, t.uid)


class Rebalancer:
    """The pass and the state it keeps between passes (nothing a new leader needs: that is in the API)."""

    def __init__(
        self, writer: Writer, settings: Settings, metrics: ControllerMetrics, ledger: Path | None = None
    ) -> None:
        self.w = writer
        self.s = settings
        self.metrics = metrics
        self.ledger = ledger
        # What was reported for which offender (claim uid -> (outcome, alert since, when)): once per alert.
        self._said: dict[str, tuple[str, float, float]] = {}
        # This replica's evictions (claim uid, when), for the budget past their rules' deletion.
        self._evicted: set[tuple[str, float]] = set()

    async def run_pass(
        self, slices: Iterable[Mapping[str, Any]], claims: Sequence[indexed.ClaimView], now: float | None = None
    ) -> list[tuple[Decision, str]]:
        """One pass over ``claims`` as the claim index holds them; returns each alert's decision and outcome (for
        tests, with ``now`` fixed)."""
        fixed_now = now
        now = time.time() if now is None else now
        rules = await asyncio.to_thread(self.w.list_device_taint_rules, moves.LABEL)
        records = {
            (m.pool, m.device): (str(r["metadata"]["name"]), m)
            for r in rules or []
            if (m := moves.move_of(r)) is not None
        }
        out: list[tuple[Decision, str]] = []
        found = signal.alerts(slices)
        namespaces = await asyncio.to_thread(self.w.namespace_labels) if found else {}
        self._evicted = {e for e in self._evicted if now - e[1] < self.s.budget_window_s}
        alerted = {a.figures.hog_uid for a in found}
        self._said = {uid: said for uid, said in self._said.items() if uid in alerted}
        for alert in found:
            rec = records.get((alert.pool, alert.device))
            last = LastMove(rec[1].hog_uid, rec[1].evicted_at) if rec else None
            evictions = self._evicted | {(m.hog_uid, m.evicted_at) for _, m in records.values()}
            d = decide(alert, claims, last, now, self.s, namespaces=namespaces, evictions=(at for _, at in evictions))
            outcome: str = d.kind
            if d.kind == "evict":
                outcome = await self._move(d, claims, rules is not None, now)
            elif d.kind in ("cooldown", "budget"):
                outcome = await self._report(d, claims, d.kind, d.why, now)
            out.append((d, outcome))
        clock = time.time if fixed_now is None else (lambda: now)
        for name, m in records.values():
            await self._upkeep(name, m, now, clock)
        return out

    # --- moving ---------------------------------------------------------------------------------
    async def _move(self, d: Decision, claims: Sequence[indexed.ClaimView], rules_served: bool, now: float) -> str:
        hog = d.hog
        assert hog is not None
        if len(hog.pods) != 1:
            why = (
                f"claim {hog.namespace}/{hog.name} is used by {len(hog.pods)} pods; evicting one would not free the GPU"
                if hog.pods
                else f"claim {hog.namespace}/{hog.name} has no pod"
            )
            return await self._report(d, claims, "shared-claim", why, now)
        claim = next((c for c in claims if c.uid == hog.uid), None)
        if self._reported(hog.uid, "refused", d.alert.since, now):
            return "refused"  # refused for this alert less than a cool-down ago: not asked again yet
        body = await asyncio.to_thread(self.w.read_pod, hog.namespace, hog.pods[0].name)
        pod = moves.pod_facts(body) if body is not None else None
        if pod is None or not pod.uid or (hog.pods[0].uid and pod.uid != hog.pods[0].uid):
            return "gone"  # gone, or another pod of that name: not the claim's consumer
        if pod.owner is None:
            why = (
                f"pod {hog.namespace}/{hog.pods[0].name} has no controller (a bare pod would not come back "
                "elsewhere); not evicted: move it, or run it under a Deployment or a Job"
            )
            return await self._report(d, claims, "bare-pod", why, now)
        if not rules_served:
            why = (
                "the DeviceTaintRule API (resource.k8s.io/v1 from Kubernetes 1.37; v1beta2 with the feature gate "
                "DRADeviceTaintRules on 1.36) is not served, so its replacement could land on the same GPU; not evicted"
            )
            return await self._report(d, claims, "no-taint-rules", why, now)
        move = moves.Move(
            pool=d.alert.pool,
            node=d.alert.node,
            device=d.alert.device,
            hog_uid=hog.uid,
            namespace=hog.namespace,
            claim=hog.name,
            pod=hog.pods[0].name,
            tier=hog.tier,
            owner=f"{pod.owner[0]}/{pod.owner[1]}",
            owner_uid=pod.owner[2],
            fraction=moves.fraction_of(claim, d.alert.pool, d.alert.device) if claim is not None else 1.0,
            evicted_at=now,
            figures=d.figures(),
            victims=", ".join(v.label() for v in d.victims),
        )
        body = moves.rule(move)
        name = body["metadata"]["name"]
        try:
            await asyncio.to_thread(self.w.delete_device_taint_rule, name)  # an expired rule not yet removed
            await asyncio.to_thread(self.w.create_device_taint_rule, body)
        except ApiError as exc:
            why = f"cannot create DeviceTaintRule {name} to keep the replacement off the GPU: {exc.said}"
            return await self._report(d, claims, "no-taint-rules", why, now)
        refused = await asyncio.to_thread(self.w.evict_pod, hog.namespace, move.pod, pod.uid)
        if refused is not None:
            await asyncio.to_thread(self.w.delete_device_taint_rule, name)
            return await self._report(d, claims, "refused", f"the Eviction API refused: {refused}", now)
        self._evicted.add((hog.uid, now))
        self.metrics.rebalance.labels(outcome="evicted").inc()
        until = time.strftime("%H:%M:%SZ", time.gmtime(now + self.s.cooldown_s))
        msg = (
            f"evicted: claim {hog.label()} used {d.figures()} while {move.victims} shares it; its "
            f"{move.owner} makes a replacement, kept off {d.alert.gpu} until {until} by DeviceTaintRule {name}"
        )
        log.warning(
            "noisy neighbour evicted",
            gpu=d.alert.gpu,
            pod=f"{hog.namespace}/{move.pod}",
            owner=move.owner,
            claim=hog.label(),
            share_pct=d.alert.figures.share_pct,
            threshold_pct=d.alert.figures.threshold_pct,
            sustain_s=d.alert.figures.sustain_s,
            persisted_s=round(d.persisted_s),
            victims=move.victims,
            fraction=move.fraction,
            rule=name,
        )
        await self._events(
            [
                (_pod_ref(hog.namespace, move.pod, pod.uid), "Warning"),
                (_claim_ref(hog), "Warning"),
            ],
            EVICTED,
            msg,
        )
        vmsg = f"{hog.tier} pod {hog.namespace}/{move.pod} ({d.figures()}) was evicted off the GPU this claim shares"
        await self._events(self._victim_refs(d), MOVED, vmsg)
        return "evicted"

    async def _report(
        self, d: Decision, claims: Sequence[indexed.ClaimView], outcome: str, why: str, now: float
    ) -> str:
        """An outcome that moves nothing: say so once per alert (a refusal: again after a cool-down)."""
        hog = d.hog
        assert hog is not None
        del claims
        if self._reported(hog.uid, outcome, d.alert.since, now):
            return outcome
        self._said[hog.uid] = (outcome, d.alert.since, now)
        self.metrics.rebalance.labels(outcome=outcome).inc()
        who = ", ".join(v.label() for v in d.victims)
        msg = f"not moved: claim {hog.label()} uses {d.figures()} while {who} shares it; {why}"
        log.warning(
            "noisy neighbour not moved",
            outcome=outcome,
            gpu=d.alert.gpu,
            claim=hog.label(),
            share_pct=d.alert.figures.share_pct,
            threshold_pct=d.alert.figures.threshold_pct,
            persisted_s=round(d.persisted_s),
            why=why,
        )
        warn: events.EventType = "Warning"
        targets = [_claim_ref(hog)] + [_pod_ref(hog.namespace, p.name, p.uid) for p in hog.pods]
        targets += [r for r, _ in self._victim_refs(d)]
        await self._events([(r, warn) for r in targets], NOT_MOVED, msg)
        try:  # display only: never read back
            await asyncio.to_thread(
                self.w.annotate_claim, hog.namespace, hog.name, {ANNOTATION: f"{outcome}@{d.alert.since:.0f}@{now:.0f}"}
            )
        except ApiError as exc:
            log.info("could not annotate claim", claim=hog.label(), status=exc.status)
        return outcome

    def _reported(self, hog_uid: str, outcome: str, since: float, now: float) -> bool:
        """Whether ``outcome`` was reported for this alert already (a refusal: less than a cool-down ago)."""
        said = self._said.get(hog_uid)
        if said is None or said[0] != outcome or said[1] != since:
            return False
        return outcome != "refused" or now - said[2] < self.s.cooldown_s

    def _victim_refs(self, d: Decision) -> list[tuple[events.ObjectRef, events.EventType]]:
        refs: list[tuple[events.ObjectRef, events.EventType]] = []
        for v in d.victims:
            refs.append((_claim_ref(v), "Normal"))
            refs.extend((_pod_ref(v.namespace, p.name, p.uid), "Normal") for p in v.pods)
        return refs

    async def _events(self, refs: Sequence[tuple[events.ObjectRef, events.EventType]], reason: str, msg: str) -> None:
        for ref, etype in refs:
            await asyncio.to_thread(self.w.event, ref, etype, reason, msg)

    # --- after a move ---------------------------------------------------------------------------
    async def _upkeep(self, name: str, m: moves.Move, now: float, clock: Callable[[], float]) -> None:
        """Charge a move once its replacement runs (or its cool-down ends); delete expired rules."""
        expired = now - m.evicted_at >= self.s.cooldown_s
        if not m.charged:
            replacement = await self._replacement(m)
            seen = clock()  # after the list that found it running: the controller's own sub-second time
            if replacement is not None or expired:
                end = moves.charge_end(m, replacement[1], seen) if replacement is not None else now
                self._charge(m, end, replacement[0] if replacement else "")
                if replacement is not None:
                    msg = (
                        f"replaces {m.namespace}/{m.pod}, moved off {m.pool}/{m.device} (noisy neighbour); "
                        f"the move cost {m.fraction * (end - m.evicted_at):.1f} GPU-seconds "
                        f"({m.fraction:.2f} of a GPU for {end - m.evicted_at:.1f}s)"
                    )
                    await asyncio.to_thread(
                        self.w.event, _pod_ref(m.namespace, replacement[0], replacement[2]), "Normal", REPLACED, msg
                    )
                if not expired:
                    charged = dataclasses.replace(m, charged=True, replacement=replacement[0] if replacement else "")
                    await asyncio.to_thread(
                        self.w.annotate_device_taint_rule, name, {moves.ANNOTATION: charged.to_json()}
                    )
        if expired:
            await asyncio.to_thread(self.w.delete_device_taint_rule, name)
            log.info("noisy-neighbour cool-down over", gpu=f"{m.pool}/{m.device}", rule=name)

    async def _replacement(self, m: moves.Move) -> tuple[str, float | None, str] | None:
        """(name, Ready time as recorded, uid) of the pod that replaced the moved one, once it runs.

        The time is Kubernetes' (whole seconds; the start time without a Ready condition; None without either).
        """
        for p in map(moves.pod_facts, await asyncio.to_thread(self.w.list_pods, m.namespace)):
            if p.owner is None or p.owner[2] != m.owner_uid or p.name == m.pod:
                continue
            if p.created + 1.0 < m.evicted_at or not p.running:
                continue
            return p.name, p.ready_since, p.uid
        return None

    def _charge(self, m: moves.Move, end: float, replacement: str) -> None:
        seg = moves.segment(m, end)
        self.metrics.moved_gpu_seconds.labels(namespace=m.namespace, tier=m.tier).inc(seg.gpu_seconds)
        log.info(
            "noisy-neighbour move charged",
            pod=f"{m.namespace}/{m.pod}",
            replacement=replacement or None,
            gpu=f"{m.pool}/{m.device}",
            fraction=m.fraction,
            seconds=round(seg.end - seg.start, 1),
            gpu_seconds=round(seg.gpu_seconds, 3),
            ledger=str(self.ledger) if self.ledger else None,
        )
        if self.ledger is None:
            return
        self.ledger.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (seg.to_json() + "\n").encode())
        finally:
            os.close(fd)
