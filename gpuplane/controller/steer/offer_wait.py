"""Whether a gated MIG pod waits for the MIG offer instead of being released. Pure.

Under the MIG offer (``controller/migoffer``, docs/mig-offer.md) a node publishes MIG placements only
for some of its GPUs. Steering places only on what is published (a placement that is not published
cannot be allocated by kube-scheduler), so a MIG pod it cannot place now may still be placeable once
the offer grows onto a GPU it may use. The offer counts the pod's claim as demand like any other
waiting MIG claim (the pod is pending, gated or not) and grows for it; steering meanwhile keeps the
pod gated (action ``wait``, outcome ``mig-offer``) and steers it on a later pass, when the driver
has published the placement. The wait is bounded by the steering timeout, after which the pod is
released to the scheduler as before.

A pod waits only when the offer could still grow for it: some idle MIG-capable GPU (no claim holds it
whole or any MIG device of it) on a node the pod may use, whose model has an accepted profile, does
not publish one now. Otherwise the catalogue already holds everything the offer can give (every
such GPU publishes, or there is none), and the pod is released as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuplane.api import names as dn
from gpuplane.api.boundedjson import mapping, mappings
from gpuplane.controller.migoffer.decide import need
from gpuplane.controller.migoffer.snapshot import mig_profiles
from gpuplane.controller.node import snapshot_builder

Allowed = Callable[[str, Mapping[str, str]], bool]
MIG_CAPABLE = f"{dn.DRIVER_NAME}/{dn.ATTR_MIG_CAPABLE}"


def growable(
    view: snapshot_builder.ClusterView,
    profiles: frozenset[str],
    allowed: Allowed | None,
    node_labels: Mapping[str, Mapping[str, str]],
) -> tuple[str, ...]:
    """Ids of the idle MIG-capable GPUs the pod may use that publish none of ``profiles`` (empty: any) now."""
    out = []
    for g in view.gpus:
        if g.attributes.get(MIG_CAPABLE) is not True or g.id in view.taken_whole or view.taken_mig.get(g.id):
            continue
        if need(g.product, profiles) is None:
            continue
        if allowed is not None and not allowed(g.node, node_labels.get(g.node, {})):
            continue
        published = view.mig_published.get(g.id, frozenset())
        if published & profiles if profiles else published:
            continue
        out.append(g.id)
    return tuple(out)


def reason(
    spec: Mapping[str, Any],
    view: snapshot_builder.ClusterView,
    allowed: Allowed | None,
    node_labels: Mapping[str, Mapping[str, str]],
) -> str | None:
    """Why the pod with claim ``spec`` waits for the MIG offer, or None when it does not (see the module)."""
    profiles = mig_profiles(mappings(mapping(spec.get("devices")).get("requests")))
    if profiles is None:
        return None
    ids = growable(view, profiles, allowed, node_labels)
    if not ids:
        return None
    what = ", ".join(sorted(profiles)) or "a MIG profile"
    return (
        f"waiting for the MIG offer: no free GPU it may use publishes {what} now; the offer grows for its "
        f"claim onto one of {len(ids)} idle GPU(s) it may use, then it is steered"
    )
