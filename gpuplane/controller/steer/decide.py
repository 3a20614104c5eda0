"""One steering pass, purely: gated pods and the cluster view in, one action per pod out.

Pods are taken oldest first. For each, in order: a pod held longer than the
timeout, already pinned to one node, or whose claim is not steerable
(``shape``) is **released** (gate lifted, nothing else changed: the scheduler
decides, as it would without gpuplane). Otherwise gpuplane's policy places its
request on the snapshot, which already holds every allocated claim, every
gang reservation and every steered pod not bound yet (``reservations``):
placed, the pod is **steered** to that node and the placement becomes a
reservation for the pods after it; refused (no room, or every free placement
would strand compute), it is **released** too and waits in the scheduler's own
queue. A pod is never held for capacity, so the gate only ever costs one
decision, and a controller that stops deciding leaves almost nothing gated.
Pods whose patches failed before (``Gated.failures``) are placed after the
others: a tenant's pod that cannot be written takes no one's room twice.

A claim template not yet in the cache is a reason to **wait** (the next event
or timer retries), until the timeout. So is a MIG request that nothing published
fits while the MIG offer can still grow for it (``offer_wait``): the offer counts
its claim as demand, and a later pass steers it onto the placement the driver
then publishes, never onto one it does not (the scheduler could not allocate it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpuplane.controller import names
from gpuplane.controller.claimtemplate import TemplateView
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.indexed import ClaimView, PodView
from gpuplane.controller.node import pod_nodes, snapshot_builder
from gpuplane.controller.steer import gate, offer_wait, shape
from gpuplane.placement import fragmentation, model, place, snapshot
from gpuplane.placement.policies import base

Kind = Literal["steer", "release", "wait"]
RESERVATION_PREFIX = "steer:"


@dataclass(frozen=True)
class Settings:
    """How steering writes its choice and how long a pod may stay gated."""

    mode: gate.Mode = "prefer"
    timeout_s: float = 30.0
    gate: str = names.STEER_GATE


@dataclass(frozen=True)
class Gated:
    """A pod held by the steering gate, with the time this controller first saw it gated."""

    key: str  # "ns/name"
    pod: PodView
    first_seen: float
    failures: int = 0  # its patches that failed so far: it is placed after the pods whose did not


@dataclass(frozen=True)
class Action:
    """What to do with one gated pod."""

    kind: Kind
    key: str
    outcome: str  # steered | no-room | unsteerable | pinned | timeout | waiting | mig-offer | republishing
    reason: str = ""
    placement: model.MemberPlacement | None = None


@dataclass
class Inputs:
    """What one pass reads: the claim, template and class index entries (views) and the cluster view."""

    view: snapshot_builder.ClusterView
    claims: Mapping[str, ClaimView]  # the claim index: "ns/name" -> its entry
    templates: Mapping[str, TemplateView]
    classes: Mapping[str, ClassView]
    waiting: Mapping[fragmentation.Shape, int] = field(default_factory=dict)  # released, still pending
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # node -> labels
    # Nodes whose driver is rewriting its slices now (mixed generations): their devices are not all visible.
    republishing: frozenset[str] = frozenset()


def decide(
    gated: Sequence[Gated],
    inputs: Inputs,
    policy: base.Policy,
    *,
    now: float,
    settings: Settings,
    shapes: Callable[[Gated], shape.Shape | str] | None = None,
) -> list[Action]:
    """One action per gated pod, oldest first (see the module docstring)."""
    view = inputs.view
    full_ids = frozenset(g.id for g in view.gpus)
    work = view.snapshot()
    placed: list[model.Decision] = []
    restricted: dict[frozenset[str], snapshot.Snapshot] = {}
    waiting = dict(inputs.waiting)
    out: list[Action] = []

    def shape_for(g: Gated) -> shape.Shape | str:
        if shapes is not None:
            return shapes(g)
        spec = shape.claim_spec_of(g.pod, inputs.claims, inputs.templates)
        if isinstance(spec, str):
            return spec
        return shape.shape_of(g.pod, spec[0], spec[1], inputs.classes, view)

    for g in sorted(gated, key=lambda x: (x.failures, x.first_seen, x.key)):
        if now - g.first_seen > settings.timeout_s:
            out.append(Action("release", g.key, "timeout", f"not decided within {settings.timeout_s:.0f}s"))
            continue
        pinned = gate.pinned_node(g.pod)
        if pinned is not None:
            out.append(Action("release", g.key, "pinned", f"its spec already allows only node {pinned}"))
            continue
        got = shape_for(g)
        if isinstance(got, str):
            offer = _offer_wait(g, inputs) if got.endswith(shape.NO_MATCH) else None
            if offer is not None:
                out.append(Action("wait", g.key, "mig-offer", offer))
                continue
            kind: Kind = "wait" if got.endswith("not known (yet)") else "release"
            out.append(Action(kind, g.key, "waiting" if kind == "wait" else "unsteerable", got))
            continue
        try:
            allowed = pod_nodes.node_filter(g.pod)
        except ValueError as exc:
            out.append(Action("release", g.key, "unsteerable", f"its node constraints use {exc}"))
            continue
        ids = got.gpus
        if allowed is not None:
            ok = {n for n in {gi.node for gi in view.gpus} if allowed(n, inputs.node_labels.get(n, {}))}
            ids = frozenset(i for i in ids if view.by_id[i].node in ok)
        snap = work if ids == full_ids else _restricted(view, ids, placed, restricted)
        s = fragmentation.shape_of(got.request)
        base.observe_queue(policy, waiting)
        d = place.place(got.request, snap, policy)
        if not d.placed:
            offer = _offer_wait(g, inputs) if got.request.mig_profile else None
            if offer is not None:
                out.append(Action("wait", g.key, "mig-offer", f"{d.reason}; {offer}"))
                continue
            busy = sorted(
                n for n in inputs.republishing if allowed is None or allowed(n, inputs.node_labels.get(n, {}))
            )
            if busy:  # part of the catalogue is missing while a driver republishes: decided again next pass
                why = f"{d.reason}; node(s) {', '.join(busy[:5])} are republishing their devices"
                out.append(Action("wait", g.key, "republishing", why))
                continue
            out.append(Action("release", g.key, "no-room", d.reason))
            waiting[s] = waiting.get(s, 0) + 1
            continue
        member = d.members[0]
        out.append(Action("steer", g.key, "steered", f"node {member.node} ({got.claim})", member))
        placed.append(d)
        work = work.with_allocation(d)
        for k in list(restricted):
            restricted[k] = _apply(restricted[k], d)
    return out


def _offer_wait(g: Gated, inputs: Inputs) -> str | None:
    """Why ``g`` (a MIG pod nothing published fits) waits for the MIG offer; None: it does not."""
    spec = shape.claim_spec_of(g.pod, inputs.claims, inputs.templates)
    try:
        allowed = pod_nodes.node_filter(g.pod)
    except ValueError:
        return None
    return None if isinstance(spec, str) else offer_wait.reason(spec[0], inputs.view, allowed, inputs.node_labels)


def _apply(snap: snapshot.Snapshot, d: model.Decision) -> snapshot.Snapshot:
    """``d`` on a restricted snapshot, for the members whose GPUs it holds."""
    keep = []
    for m in d.members:
        ids = list(m.gpus) + [s.gpu for s in m.mig]
        try:
            for i in ids:
                snap.locate(i)
        except KeyError:
            continue
        keep.append(m)
    return snap.with_allocation(model.Decision(d.request_id, tuple(keep))) if keep else snap


def _restricted(
    view: snapshot_builder.ClusterView,
    ids: frozenset[str],
    placed: Sequence[model.Decision],
    cache: dict[frozenset[str], snapshot.Snapshot],
) -> snapshot.Snapshot:
    got = cache.get(ids)
    if got is None:
        uuids = {g.attributes.get("gpu.gpuplane.dev/uuid") for g in view.gpus if g.id in ids}
        got = view.snapshot(lambda _driver, attrs: attrs.get("gpu.gpuplane.dev/uuid") in uuids)
        for d in placed:
            got = _apply(got, d)
        cache[ids] = got
    return got


def reservation_of(pod: PodView, annotation: str) -> snapshot_builder.Reservation | None:
    """The placement a steered, not yet bound pod holds (from its annotation), for the next passes' view."""
    text = (pod.annotations or {}).get(annotation)
    if not text or pod.node_name:
        return None
    try:
        mp = decode_placement(text)
    except ValueError:
        return None
    return snapshot_builder.Reservation(f"{RESERVATION_PREFIX}{pod.key}", mp)


def encode_placement(m: model.MemberPlacement) -> str:
    """``node;domain;gpu,gpu`` or ``node;domain;mig=gpu/profile/start`` (the steered-pod annotation)."""
    what = "mig=" + ",".join(f"{s.gpu}/{s.profile}/{s.start}" for s in m.mig) if m.mig else ",".join(m.gpus)
    return f"{m.node};{m.domain};{what}"


def decode_placement(text: str) -> model.MemberPlacement:
    """The inverse of :func:`encode_placement`; ValueError when it is not one."""
    node, domain, what = text.split(";", 2)
    if what.startswith("mig="):
        slots = []
        for item in what[4:].split(","):
            gpu, prof, start = item.rsplit("/", 2)
            slots.append(model.MigSlot(gpu, prof, int(start)))
        return model.MemberPlacement(0, node, domain, mig=tuple(slots))
    return model.MemberPlacement(0, node, domain, gpus=tuple(x for x in what.split(",") if x))
