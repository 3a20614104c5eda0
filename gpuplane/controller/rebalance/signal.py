"""Noisy-neighbour alerts and the tenants of a GPU, read from ResourceSlices and ResourceClaims. Pure.

An alert is a device taint :data:`gpuplane.api.noisy_taint.KEY` on a device of a
gpuplane ResourceSlice (see that module for why a slice taint); its ``timeAdded`` is when the
driver raised it. The tenants of a GPU are the allocated claims (as the claim index holds them:
:class:`gpuplane.controller.indexed.ClaimView`) whose results of this driver name that device
of that pool, each with its tier: the ``mps-<tier>`` DeviceClass of the request (or
``firstAvailable`` subrequest) the device was allocated for, capped at the tier the claim's
namespace is entitled to (:mod:`gpuplane.controller.rebalance.entitlement`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import kubetime, names, noisy_taint
from gpuplane.controller import indexed
from gpuplane.controller.rebalance import entitlement
from gpuplane.controller.rightsize import fleet

DEFAULT_RANKS: Mapping[str, int] = {"gold": 3, "silver": 2, "bronze": 1}


@dataclass(frozen=True)
class Alert:
    """An active noisy-neighbour alert on one GPU."""

    pool: str
    node: str
    device: str
    figures: noisy_taint.NoisyFigures
    since: float  # unix seconds: when the driver raised it

    @property
    def gpu(self) -> str:
        """``<pool>/<device>`` for messages."""
        return f"{self.pool}/{self.device}"


@dataclass(frozen=True)
class PodRef:
    """A consumer of a claim (``status.reservedFor``)."""

    name: str
    uid: str


@dataclass(frozen=True)
class Tenant:
    """A claim allocated on the alert's GPU."""

    uid: str
    namespace: str
    name: str
    tier: str  # as it counts: at most its namespace's entitled tier
    rank: int
    pods: tuple[PodRef, ...]
    declared: str = ""  # the tier of its class, when above what its namespace is entitled to
    system: bool = False  # in a system namespace: never evicted

    def label(self) -> str:
        """``ns/name (tier)`` for messages."""
        if self.declared:
            return f"{self.namespace}/{self.name} ({self.tier}: class {self.declared}, namespace not entitled)"
        return f"{self.namespace}/{self.name} ({self.tier})"


def alerts(slices: Iterable[Mapping[str, Any]]) -> list[Alert]:
    """Every noisy-neighbour taint on gpuplane's published devices (malformed ones are ignored)."""
    out: list[Alert] = []
    for item in slices:
        spec = item.get("spec") if "spec" in item else item
        if not isinstance(spec, Mapping) or spec.get("driver") != names.DRIVER_NAME:
            continue
        pool = (spec.get("pool") or {}).get("name")
        node = spec.get("nodeName") or pool
        if not isinstance(pool, str) or not isinstance(node, str):
            continue
        for device in spec.get("devices") or []:
            if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
                continue
            for taint in device.get("taints") or []:
                if not isinstance(taint, Mapping) or taint.get("key") != noisy_taint.KEY:
                    continue
                figures = noisy_taint.decode(taint.get("value"))
                since = kubetime.epoch(taint.get("timeAdded"))
                if figures is not None and since is not None:
                    out.append(Alert(pool, node, str(device["name"]), figures, since))
    return sorted(out, key=lambda a: (a.pool, a.device))


def _class_of(claim: indexed.ClaimView, request: str) -> str | None:
    main, _, sub = request.partition("/")
    for req in claim.requests:
        if req.get("name") != main:
            continue
        if not sub:
            name = (req.get("exactly") or {}).get("deviceClassName")
            return name if isinstance(name, str) else None
        for alt in req.get("firstAvailable") or []:
            if alt.get("name") == sub and isinstance(alt.get("deviceClassName"), str):
                return str(alt["deviceClassName"])
    return None


def tenants(
    claims: Iterable[indexed.ClaimView],
    pool: str,
    device: str,
    ranks: Mapping[str, int] = DEFAULT_RANKS,
    namespaces: Mapping[str, entitlement.Labels] | None = None,
) -> list[Tenant]:
    """The allocated claims on ``pool``/``device`` (``claims``: as the claim index holds them), with their tiers
    (an untiered claim has rank 0).

    ``namespaces``: the labels of each namespace (an administrator's); a namespace missing there is
    unlabelled, so its claims count as :data:`~gpuplane.controller.rebalance.entitlement.DEFAULT_MAX_TIER`
    at most.
    """
    namespaces = namespaces or {}
    out: list[Tenant] = []
    for claim in claims:
        here = [r for r in claim.results if r.pool == pool and r.device == device]
        if not here:
            continue
        class_name = _class_of(claim, here[0].request)
        declared = fleet.tier_of_class(class_name or "") or "none"
        ns = claim.namespace
        labels = namespaces.get(ns)
        tier = entitlement.entitled(declared, labels, ranks)
        pods = tuple(PodRef(r.name, r.uid) for r in claim.reserved_for if r.resource == "pods" and r.name)
        out.append(
            Tenant(
                uid=claim.uid,
                namespace=ns,
                name=claim.name,
                tier=tier,
                rank=ranks.get(tier, 0),
                pods=pods,
                declared=declared if declared != tier else "",
                system=entitlement.is_system(ns, labels),
            )
        )
    return sorted(out, key=lambda t: (-t.rank, t.namespace, t.name))
