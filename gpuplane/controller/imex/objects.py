"""The IMEX plan as ``ImexDomain`` objects, and what to change to get there: pure, no I/O.

``render`` turns :func:`gpuplane.controller.imex.decide.plan`'s domains and each gang's member claims into
the API objects (one per domain, named after the domain, so an object keeps its name while gangs join it);
every object is checked with the driver's own parser (:func:`gpuplane.api.imex.parse_domain`) and a domain
that would not parse is left out with the reason, so the controller never writes what a driver refuses.
``diff`` compares the desired objects with those that exist, by name, on the spec only (the status is the
drivers').
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.api import imex
from gpuplane.controller.imex.decide import Plan

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuplane-controller", "app.kubernetes.io/part-of": "gpuplane"}


@dataclass(frozen=True)
class GangMembers:
    """A gang's identity and its member claims as placed (each on its node)."""

    namespace: str
    name: str
    claims: tuple[imex.Claim, ...]


@dataclass(frozen=True)
class Rendered:
    """The objects to exist, and the domains left out with why (by domain name)."""

    objects: tuple[dict[str, Any], ...]
    refused: Mapping[str, str]


@dataclass(frozen=True)
class Diff:
    """Objects to create, objects whose spec to replace (desired form), names to delete."""

    create: tuple[dict[str, Any], ...]
    update: tuple[dict[str, Any], ...]
    delete: tuple[str, ...]


def render(
    plan: Plan,
    members: Mapping[str, GangMembers],
    namespace: str = imex.NAMESPACE,
    addresses: Mapping[str, str] | None = None,
) -> Rendered:
    """One ``ImexDomain`` object per domain of ``plan``; ``members`` by gang uid; ``addresses``: node -> its
    InternalIP (a node without one is left out of ``spec.addresses``: its driver runs no daemon until it has one)."""
    objects: list[dict[str, Any]] = []
    refused: dict[str, str] = {}
    for domain in plan.domains:
        missing = [uid for uid in domain.gangs if uid not in members]
        if missing:
            refused[domain.name] = f"IMEX domain {domain.name}: no member claims known for gang(s) {', '.join(missing)}"
            continue
        gangs = tuple(
            imex.Gang(
                namespace=members[uid].namespace,
                name=members[uid].name,
                uid=uid,
                channel=plan.channels[uid],
                claims=tuple(sorted(members[uid].claims, key=lambda c: (c.node, c.name, c.uid))),
            )
            for uid in domain.gangs
        )
        known = addresses or {}
        where = tuple((n, known[n]) for n in sorted(domain.nodes) if known.get(n))
        model = imex.ImexDomain(domain.name, 0, domain.clique, tuple(domain.nodes), gangs, addresses=where)
        obj = {
            "apiVersion": imex.API_VERSION,
            "kind": imex.KIND,
            "metadata": {"name": domain.name, "namespace": namespace, "labels": dict(MANAGED_BY)},
            "spec": imex.domain_to_spec(model),
        }
        _, why = imex.parse_domain(obj)
        if why:
            refused[domain.name] = why
            continue
        objects.append(obj)
    return Rendered(tuple(objects), refused)


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""


def diff(desired: Sequence[Mapping[str, Any]], existing: Iterable[Mapping[str, Any]]) -> Diff:
    """What to create, update (spec differs) and delete so that ``existing`` becomes ``desired``, by name."""
    have = {_name(o): o for o in existing if _name(o)}
    want = {_name(o): o for o in desired}
    create = tuple(dict(want[n]) for n in sorted(want) if n not in have)
    update = tuple(dict(want[n]) for n in sorted(want) if n in have and have[n].get("spec") != want[n].get("spec"))
    delete = tuple(sorted(n for n in have if n not in want))
    return Diff(create, update, delete)
