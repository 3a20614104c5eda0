"""The MIG offer's view of the fleet, from the controller's indexes: nodes, their GPUs, waiting MIG claims. Pure.

Claims are read as the claim index holds them (:class:`~gpuplane.controller.indexed.ClaimView`: the requests
as written, whether allocated, this driver's results). Everything here is read from what users and drivers write
(claims, pods, slices): a name that is not a
device name, a selector that names no known profile, a pod whose node affinity cannot be read, all
count for nothing rather than raising (a claim whose profile is unknown waits with any profile's
offer; a pod whose affinity is unreadable may go anywhere).

A claim is demand only while kube-scheduler (or gpuplane's own steering or gang placement, which
lift their gates by the same catalogue) will try its pod: a pod that carries a scheduling gate of
anyone else's, or gpuplane's steer gate where steering never lifts it (a namespace not opted in to
steering, or annotations too full for steering's own), is held by its owner and asks nothing of the
offer (a tenant could otherwise grow the offer with pods that never run).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from gpuplane.api import kubetime
from gpuplane.api import names as dn
from gpuplane.controller import indexed, names
from gpuplane.controller.migoffer.decide import Gpu, Node, Waiting
from gpuplane.controller.node import pod_nodes
from gpuplane.controller.node.slice_index import SliceDigest, newest

POOL_LABEL = "gpuplane.dev/node-pool"
MAX_POOL = 63
_PROFILE = re.compile(r"""migProfile\s*==\s*["']([A-Za-z0-9.+]{1,32})["']""")
_GPU = re.compile(r"^(gpu-[0-9]{1,4})(-mig-.*)?$")


def _alternatives(requests: Iterable[Any]) -> list[Mapping[str, Any]]:
    """Each request's alternatives (``exactly`` or each ``firstAvailable`` entry), as the API spells them."""
    out: list[Mapping[str, Any]] = []
    for r in requests:
        if not isinstance(r, Mapping):
            continue
        first = r.get("firstAvailable")
        alternatives: list[Any] = first if isinstance(first, list) else [r.get("exactly") or r]
        out.extend(a for a in alternatives if isinstance(a, Mapping))
    return out


def mig_profiles(requests: Iterable[Any], mig_class: str = names.DEFAULT_MIG_DEVICE_CLASS) -> frozenset[str] | None:
    """The MIG profiles a claim's ``requests`` (``spec.devices.requests``) ask for (empty: any); None when they
    ask for no MIG device."""
    found: set[str] = set()
    asks = False
    for alt in _alternatives(requests):
        if alt.get("deviceClassName") != mig_class:
            continue
        asks = True
        for sel in alt.get("selectors") or []:
            expr = (sel.get("cel") or {}).get("expression") if isinstance(sel, Mapping) else None
            if isinstance(expr, str):
                found.update(_PROFILE.findall(expr[:10_000]))
    return frozenset(found) if asks else None


def _age_s(stamp: Any, now: datetime.datetime) -> float:
    created = kubetime.epoch(stamp)
    return 0.0 if created is None else max(0.0, now.timestamp() - created)


def tried(pod: indexed.PodView, steering: Collection[str] | None) -> bool:
    """Whether ``pod`` is one the scheduler, steering or the gang placement will try: no gate but gpuplane's own
    (the steer gate only in a namespace of ``steering``, those opted in, None: not known yet, none; and only
    while steering can write to the pod)."""
    namespace = pod.namespace
    for name in pod.gates:
        if name == names.SCHEDULING_GATE:
            continue
        steerable = steering is not None and namespace in steering and not pod.annotations_full
        if name == names.STEER_GATE and steerable:
            continue
        return False
    return True


def waiting(
    claims: Mapping[str, indexed.ClaimView],
    consumers: Mapping[str, Iterable[str]],
    pending_pods: Mapping[str, indexed.PodView],
    now: datetime.datetime,
    steering: Collection[str] | None = None,
) -> tuple[Waiting, ...]:
    """Unallocated MIG claims with a pending pod that will be tried (``consumers``: claim key -> pod names;
    ``steering``: the namespaces opted in to steering)."""
    out: list[Waiting] = []
    for key, claim in claims.items():
        if claim.allocated or claim.deleting:
            continue
        profiles = mig_profiles(claim.requests)
        if profiles is None:
            continue
        namespace = key.partition("/")[0]
        pods = [pending_pods[f"{namespace}/{p}"] for p in consumers.get(key, ()) if f"{namespace}/{p}" in pending_pods]
        pods = [p for p in pods if tried(p, steering)]
        if not pods:
            continue
        try:
            allowed = pod_nodes.node_filter(pods[0])
        except (ValueError, TypeError, AttributeError):
            allowed = None
        out.append(Waiting(key=key, profiles=profiles, allowed=allowed, age_s=_age_s(claim.created, now)))
    return tuple(out)


def _gpu_of(device: Any) -> str | None:
    match = _GPU.match(device) if isinstance(device, str) else None
    return match.group(1) if match else None


def nodes(
    digests: list[SliceDigest], node_index: Mapping[str, indexed.NodeView], claims: Iterable[indexed.ClaimView]
) -> tuple[Node, ...]:
    """Every node with MIG-capable GPUs in its (newest) slices, with what is allocated on them (a claim view's
    ``results`` are this driver's only)."""
    mig_alloc: set[tuple[str, str]] = set()
    whole_alloc: set[tuple[str, str]] = set()
    for claim in claims:
        for r in claim.results:
            gpu = _gpu_of(r.device)
            if gpu is None or not r.pool:
                continue
            (whole_alloc if r.device == gpu else mig_alloc).add((r.pool, gpu))
    capable: dict[str, dict[str, str]] = {}
    published: set[tuple[str, str]] = set()
    for d in newest(digests):
        for g in d.gpus:
            if g.attributes.get(f"{dn.DRIVER_NAME}/{dn.ATTR_MIG_CAPABLE}") is True:
                capable.setdefault(d.node, {})[g.device] = g.product
        for m in d.mig.values():
            if m.parent_minor is not None:
                published.add((d.node, f"gpu-{m.parent_minor}"))
    out: list[Node] = []
    for node_name, gpus in sorted(capable.items()):
        entry = node_index.get(node_name)
        labels = entry.labels if entry is not None else {}
        pool = labels.get(POOL_LABEL)
        if not isinstance(pool, str) or not 0 < len(pool) <= MAX_POOL:
            pool = next(iter(sorted(gpus.values())), "")[:MAX_POOL] or "unknown"
        out.append(
            Node(
                name=node_name,
                pool=pool,
                schedulable=entry is not None and entry.schedulable,
                labels=labels,
                gpus=tuple(
                    Gpu(
                        name=g,
                        product=product,
                        mig_published=(node_name, g) in published,
                        mig_allocated=(node_name, g) in mig_alloc,
                        whole_allocated=(node_name, g) in whole_alloc,
                    )
                    for g, product in sorted(gpus.items())
                ),
            )
        )
    return tuple(out)
