"""Gate-and-steer in the running controller: one steering pass under the process lock (the wiring calls it).

Builds the placement view (the slice index's digests, parsed once when each slice changed; allocated claims, gang
reservations, steered pods not bound yet) and hands it to ``steer.reconciler.run_pass`` in a thread.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from gpuplane.controller import indexed, kube
from gpuplane.controller.claimtemplate import TemplateView
from gpuplane.controller.gang import world
from gpuplane.controller.node import slice_index, snapshot_builder
from gpuplane.controller.runtime import Runtime
from gpuplane.controller.steer import decide as steer_decide
from gpuplane.controller.steer import reconciler as steer_reconciler

log = structlog.get_logger(__name__)


def node_labels(nodes: Mapping[str, indexed.NodeView]) -> dict[str, Mapping[str, str]]:
    """Node -> its labels, from the node index (``indexed.node`` keeps every label for this)."""
    return {n: v.labels for n, v in nodes.items()}


async def _opted_in(rt: Runtime, now: float) -> frozenset[str] | None:
    """The namespaces opted in to steering, re-read at most every ``OPTED_IN_TTL_S`` (the last good
    answer kept when a read fails). Read from the Namespaces, which tenants cannot label: a pod that
    carries the steer gate elsewhere put it there itself and is not gpuplane's to decide."""
    state = rt.state(steer_reconciler.SteerState)
    if now - state.opted_in_at < steer_reconciler.OPTED_IN_TTL_S:
        return state.opted_in
    try:
        got = await asyncio.to_thread(rt.writer.namespaces_labelled, steer_reconciler.OPTED_IN_SELECTOR)
    except Exception as exc:  # the API or the network: keep the last answer, try again next pass
        log.warning("could not list the namespaces opted in to steering", error=str(exc))
        return state.opted_in
    state.opted_in, state.opted_in_at = got, now
    return got


def republishing(slices: Iterable[Any]) -> frozenset[str]:
    """Nodes whose driver is rewriting its slices now: they carry more than one generation, or the newest
    generation lacks slices its ``resourceSliceCount`` promises. kube-scheduler uses only a pool's newest,
    complete generation (none while it is incomplete), and this view sees part of the node's devices."""
    slices = list(slices)
    generations: dict[str, set[int]] = {}
    for d in slices:
        node, generation = getattr(d, "node", None), getattr(d, "generation", None)
        if isinstance(node, str) and isinstance(generation, int):
            generations.setdefault(node, set()).add(generation)
    digests = [d for d in slices if isinstance(d, slice_index.SliceDigest)]
    return frozenset(n for n, g in generations.items() if len(g) > 1) | slice_index.incomplete(digests)


async def steer_pass(
    rt: Runtime,
    w: world.World,
    *,
    pending: Iterable[indexed.PodView],
    templates: Mapping[str, TemplateView],
    now: float,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """One steering pass over the gated pods (under the process lock, leader only)."""
    if not rt.leading():
        return
    pods = list(pending)
    settings = steer_decide.Settings(mode=rt.cfg.steer_mode, timeout_s=rt.cfg.steer_timeout_s)
    opted_in, state = await _opted_in(rt, now), rt.state(steer_reconciler.SteerState)
    if opted_in is None or not steer_reconciler.gated_pods(pods, state, settings, now, opted_in):
        return  # nothing gated that this replica may decide now: no view to build
    started = time.monotonic()
    base = snapshot_builder.build_view(w.slices, w.claims.values(), w.nodes)
    extra = [
        *world.reservations(w, base),
        *steer_reconciler.reservations(pods, state, w.claims.values(), now),
    ]
    view = snapshot_builder.build_view(w.slices, w.claims.values(), w.nodes, reservations=extra)
    log.debug("steering view built", ms=round(1000 * (time.monotonic() - started), 1), pods=len(pods))
    try:
        await asyncio.to_thread(
            functools.partial(
                steer_reconciler.run_pass,
                rt.writer,
                rt.policy,
                rt.metrics,
                state,
                settings,
                pending=pods,
                view=view,
                claims=w.claims,
                templates=templates,
                classes=w.classes,
                now=now,
                node_labels=node_labels,
                opted_in=opted_in,
                republishing=republishing(w.slices),
            )
        )
    except kube.NotLeader:
        log.info("lost leadership during a steering pass; the new leader resumes from the API")
    rt.touched()
