"""The leader's MIG-offer pass: the fleet read from the indexes, the offer decided, the ConfigMap written. Does I/O.

Every ``INTERVAL_S`` while this replica leads (once the informers synced): one copy of the indexes
(slices, nodes, claims, pending pods) becomes a snapshot (:mod:`.snapshot`), :func:`.decide.decide` sizes
the offer, and the ConfigMap ``gpuplane-mig-offer`` is written only when the offer's text changed (one write;
each driver whose GPUs changed republishes its own slices). A claim that starts waiting for an offer gets
one Event saying on which node and pool. The nodes the offer names carry the label
``gpuplane.dev/mig-offered=true`` and no other node does (at most ``MAX_LABEL_WRITES`` node patches a pass,
each fenced; the rest the next pass). A new term first reads the ConfigMap back (what the last leader
wrote). A failed pass is logged; the next one runs ``INTERVAL_S`` later; a lost leadership ends a pass at
its write (fenced).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf
import structlog

from gpuplane.api import mig_offer
from gpuplane.controller import events, indexed, kube, periodic, runtime
from gpuplane.controller.migoffer import decide, snapshot
from gpuplane.controller.node import slice_index
from gpuplane.informer.client import ApiError

log = structlog.get_logger(__name__)
INTERVAL_S = 2.0
MAX_LABEL_WRITES = 50  # node label patches per pass (an offer naming every node labels them over passes)
CLAIM_API = "resource.k8s.io/v1"


class OfferApi:
    """The one ConfigMap: read back, created or replaced (fenced writes through the controller's client)."""

    def __init__(self, writer: kube.KubeWriter) -> None:
        self.writer = writer

    def read(self) -> tuple[mig_offer.Offer, bool]:
        """The offer the API holds, and whether the ConfigMap exists (a garbled one reads as empty)."""
        cm = self.writer.get(kube.CONFIGMAPS, mig_offer.NAMESPACE, mig_offer.CONFIGMAP)
        if cm is None:
            return mig_offer.Offer(), False
        data = cm.get("data")
        text = data.get(mig_offer.DATA_KEY) if isinstance(data, dict) else None
        try:
            return mig_offer.parse(text if isinstance(text, str) else ""), True
        except mig_offer.OfferError as exc:
            log.warning("the MIG offer in the API is not valid; writing a new one", error=str(exc))
            return mig_offer.Offer(), True

    def write(self, offer: mig_offer.Offer, exists: bool) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": mig_offer.CONFIGMAP,
                "namespace": mig_offer.NAMESPACE,
                "labels": {"app.kubernetes.io/managed-by": "gpuplane-controller"},
            },
            "data": {mig_offer.DATA_KEY: mig_offer.render(offer)},
        }
        if not exists:
            try:
                self.writer.create(kube.CONFIGMAPS, mig_offer.NAMESPACE, body)
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
        self.writer.replace(kube.CONFIGMAPS, mig_offer.NAMESPACE, mig_offer.CONFIGMAP, body)


class Pass:
    def __init__(
        self,
        rt: runtime.Runtime,
        kw: Mapping[str, Any],
        settings: decide.Settings,
        opted_in: Callable[[], frozenset[str] | None] = lambda: None,
    ) -> None:
        self.rt, self.kw, self.settings, self.opted_in = rt, kw, settings, opted_in
        self.api = OfferApi(rt.writer)
        self.memory: decide.Memory | None = None
        self.writes = 0
        self.label_writes = 0

    def node_labels(self) -> dict[str, Mapping[str, str]]:
        """Each indexed node's labels (``indexed.node`` keeps them all)."""
        return {n: v.labels for n, v in indexed.single(self.kw["node_idx"]).items()}

    async def label(self, offer: mig_offer.Offer) -> None:
        """The ``gpuplane.dev/mig-offered`` label on exactly the nodes ``offer`` names (a bounded batch a pass)."""
        async with self.rt.lock():
            changes = decide.node_labels(offer, self.node_labels())
        batch = changes[:MAX_LABEL_WRITES]
        for node, on in batch:
            value = mig_offer.NODE_LABEL_VALUE if on else None
            try:
                await asyncio.to_thread(
                    self.rt.writer.patch_node, node, {"metadata": {"labels": {mig_offer.NODE_LABEL: value}}}
                )
            except ApiError as exc:
                if exc.status != 404:  # a node deleted meanwhile needs no label
                    raise
            self.label_writes += 1
        if changes:
            log.info(
                "MIG-offer node labels written",
                on=[n for n, on in batch if on][:20],
                off=[n for n, on in batch if not on][:20],
                left=len(changes) - len(batch),
            )

    def fleet(self, claims: Mapping[str, indexed.ClaimView]) -> tuple[decide.Node, ...]:
        """The nodes with MIG-capable GPUs, from the slice and node indexes and what ``claims`` hold."""
        kw = self.kw
        return snapshot.nodes(slice_index.every(kw["slice_idx"]), indexed.single(kw["node_idx"]), claims.values())

    def view(self) -> tuple[tuple[decide.Node, ...], tuple[decide.Waiting, ...], dict[str, indexed.ClaimView]]:
        kw = self.kw
        claims: dict[str, indexed.ClaimView] = indexed.single(kw["claim_idx"])
        consumers = {k: list(v) for k, v in kw["claim_consumer_idx"].items()}
        pods = indexed.single(kw["pending_pod_idx"])
        now = datetime.datetime.now(datetime.UTC)
        fleet = self.fleet(claims)
        steering = self.opted_in()  # what steering last read of the Namespaces (None: not yet)
        return fleet, snapshot.waiting(claims, consumers, pods, now, steering), claims

    async def once(self) -> decide.Decision:
        if self.memory is None:
            offer, exists = await asyncio.to_thread(self.api.read)
            self.memory = decide.Memory(offer=offer, written=exists)
        async with self.rt.lock():
            fleet, waiting, claims = self.view()
        d = decide.decide(fleet, waiting, self.memory, self.settings, time.monotonic())
        changed = mig_offer.render(d.offer) != mig_offer.render(self.memory.offer) or not self.memory.written
        if changed:
            await asyncio.to_thread(self.api.write, d.offer, self.memory.written)
            self.writes += 1
            log.info(
                "MIG offer written",
                gpus=d.offer.gpu_count(),
                nodes=len(d.offer.nodes),
                grown=[f"{n}/{g}" for n, g in d.grown][:20],
                withdrawn=[f"{n}/{g}" for n, g in d.withdrawn][:20],
                waiting=len(waiting),
            )
        self.memory = dataclasses.replace(d.memory, written=True)
        await self.label(d.offer)
        for key, message in d.explain:
            claim = claims.get(key)
            namespace, _, name = key.partition("/")
            uid = claim.uid if claim is not None else ""
            ref = events.ObjectRef(CLAIM_API, "ResourceClaim", name, namespace, uid)
            await asyncio.to_thread(self.rt.writer.event, ref, "Normal", "WaitingForMigOffer", message)
        return d

    async def labels_only(self) -> None:
        """With the offer off (``--no-mig-offer``): the label on every node whose slices publish MIG placements,
        so that a pod asking for it still finds every node that can serve it."""
        async with self.rt.lock():
            fleet = self.fleet(indexed.single(self.kw["claim_idx"]))
        await self.label(decide.published(fleet))


def register(
    reg: kopf.OperatorRegistry,
    settings: decide.Settings,
    enabled: bool = True,
    opted_in: Callable[[runtime.Runtime], frozenset[str] | None] = lambda rt: None,
) -> None:
    """The loop's start on ``reg``: leader-only, like the controller's other loops. ``opted_in``: the
    namespaces opted in to steering as steering last read them (the wiring's; the offer never imports steering).
    """

    @kopf.on.startup(registry=reg)
    async def start_mig_offer(memo: runtime.Runtime, **_: Any) -> None:
        one = Pass(memo, memo.caches.indexes, settings, lambda: opted_in(memo))
        if not enabled:
            labels = periodic.every(INTERVAL_S, memo.leading, one.labels_only, "MIG-offered labels")
            memo.shared.tasks.append(asyncio.create_task(runtime.after_sync(memo, labels)))
            return
        term = [memo.leading()]

        def leading() -> bool:
            now = memo.leading()
            if now and not term[0]:
                one.memory = None  # a new term reads back what the last leader wrote
            term[0] = now
            return now

        loop = periodic.every(INTERVAL_S, leading, one.once, "MIG offer")
        memo.shared.tasks.append(asyncio.create_task(runtime.after_sync(memo, loop)))
