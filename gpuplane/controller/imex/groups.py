"""IMEX groups: allocated claims labelled ``gpuplane.dev/imex-group`` gathered into gang-like entries. Pure.

A user who places pods by hand (no ``GpuGang``) asks for an IMEX domain by labelling their claims, directly or
through a ResourceClaimTemplate's ``metadata.labels`` (:mod:`gpuplane.api.imex_group`). Read from one copy of
the controller's indexes (:class:`gpuplane.controller.gang.world.World`), its claims as the claim index keeps
them (:class:`gpuplane.controller.indexed.ClaimView`: the labels, owners, creation time and this driver's results):

- a **group** is the allocated claims (by this driver, so each sits on the node its pool names) of one
  namespace carrying one valid name; a tenant's group never holds another namespace's claims (the key is
  namespace and name). A claim being deleted or not yet allocated is left out; when the last one goes, so
  does the group, and its domain goes or shrinks on the next pass;
- it is planned exactly like a gang (:func:`gpuplane.controller.imex.decide.plan`, ``kind="IMEX group"``,
  uid :func:`gpuplane.api.imex_group.group_uid`, since = its oldest claim's creation), so it needs IMEX only
  when its claims sit on two or more nodes of one clique, and gets a channel of its own;
- a claim in a gang (a member's claim: labelled ``gpuplane.dev/gang``, owned by a ``GpuGang``, or given to a
  template member's pod) **follows the gang**: it is never a group's;
- refused, each with an Event on every claim concerned (:class:`Refusal`; the reconcile pass tells each once)
  and nothing else changed: a label that is not a valid name (``ImexGroupInvalid``; the claim is treated as
  unlabelled), a group past ``MAX_CLAIMS`` claims, and a namespace's groups past ``max_per_namespace``
  (``ImexGroupRefused``; groups holding a channel keep it first, then the oldest), so one tenant cannot take a
  clique's channels or fill a node's domain. The plan's own refusals of a group (cliques, channels, a full
  domain) become Events the same way (:func:`plan_refusals`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuplane.api import imex, imex_group, kubetime
from gpuplane.controller import indexed
from gpuplane.controller.gang import world
from gpuplane.controller.imex.decide import PlacedGang
from gpuplane.controller.imex.objects import GangMembers

KIND = "IMEX group"
MAX_PER_NAMESPACE = 4
"""IMEX groups needing a domain at once per namespace (each holds a channel of its clique)."""
MAX_CLAIMS = imex.MAX_CLAIMS


@dataclass(frozen=True)
class Refusal:
    """An Event for one claim: ``reason`` and ``message`` (Warning)."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str


@dataclass(frozen=True)
class Groups:
    """The groups to plan, each one's claims (by group uid), and the Events for claims refused."""

    gangs: tuple[PlacedGang, ...]
    members: Mapping[str, GangMembers]
    refusals: tuple[Refusal, ...]


def pool_node(claim: indexed.ClaimView) -> str:
    """The node this driver's allocation of ``claim`` sits on ("" while unallocated or not on one node)."""
    pools = {r.pool for r in claim.results}
    return pools.pop() if len(pools) == 1 else ""


def group_of(claim: indexed.ClaimView) -> tuple[str, str]:
    """:func:`gpuplane.api.imex_group.group_of` of an indexed claim: (its group, "") or ("", why the label is
    refused); ("", "") when it has no label."""
    if imex_group.LABEL not in claim.labels:
        return "", ""
    return imex_group.group_named(claim.labels[imex_group.LABEL])


def in_gang(claim: indexed.ClaimView) -> bool:
    """:func:`gpuplane.api.imex_group.in_gang` of an indexed claim: a gang's label or a ``GpuGang`` owner."""
    return imex_group.GANG_LABEL in claim.labels or any(o.kind == imex_group.GANG_KIND for o in claim.owners)


def created_at(claim: indexed.ClaimView) -> float:
    """The claim's creation in epoch seconds (0 when the index kept none)."""
    return kubetime.epoch(claim.created) or 0.0


@dataclass
class _Gathered:
    namespace: str
    name: str
    claims: list[imex.Claim]
    since: float


def _gather(
    w: world.World, gang_claims: Callable[[], Iterable[str]]
) -> tuple[dict[tuple[str, str], _Gathered], list[Refusal]]:
    skip: set[str] | None = None  # read only when a labelled claim is found (a cluster without groups pays nothing)
    found: dict[tuple[str, str], _Gathered] = {}
    refusals: list[Refusal] = []
    labelled = [(k, c) for k, c in w.claims.items() if imex_group.LABEL in c.labels]
    for key, claim in sorted(labelled, key=lambda kc: kc[0]):
        ns, cname = key.split("/", 1)
        uid = claim.uid
        group, why = group_of(claim)
        if why:
            refusals.append(Refusal(ns, cname, uid, "ImexGroupInvalid", f"{why}; the claim gets no IMEX group"))
            continue
        if not group or not uid or claim.deleting or in_gang(claim):
            continue
        if skip is None:
            skip = set(gang_claims())
        if key in skip:
            continue
        node = pool_node(claim)
        if not node:
            continue
        entry = found.setdefault((ns, group), _Gathered(ns, group, [], created_at(claim)))
        entry.claims.append(imex.Claim(namespace=ns, name=cname, uid=uid, node=node))
        entry.since = min(entry.since, created_at(claim))
    return found, refusals


def _refuse(g: _Gathered, message: str) -> list[Refusal]:
    return [Refusal(g.namespace, c.name, c.uid, "ImexGroupRefused", message) for c in g.claims]


def gather(
    w: world.World,
    cliques: Mapping[str, str],
    channels: Mapping[str, int],
    gang_claims: Callable[[], Iterable[str]] = tuple,
    max_per_namespace: int = MAX_PER_NAMESPACE,
) -> Groups:
    """The IMEX groups of ``w`` (see the module docstring); ``cliques``: node -> clique; ``channels``: entry uid ->
    the channel the existing objects give it; ``gang_claims``: "ns/name" of claims a gang's pods were given (called
    once, only when a claim carries the label)."""
    found, refusals = _gather(w, gang_claims)
    out: list[PlacedGang] = []
    members: dict[str, GangMembers] = {}
    per_ns: dict[str, int] = {}
    ordered = sorted(
        found.values(),
        key=lambda g: (imex_group.group_uid(g.namespace, g.name) not in channels, g.since, g.name),
    )
    for g in ordered:
        uid = imex_group.group_uid(g.namespace, g.name)
        key = f"{g.namespace}/{g.name}"
        nodes = tuple(sorted({c.node for c in g.claims}))
        if len(g.claims) > MAX_CLAIMS:
            refusals += _refuse(g, f"{KIND} {key}: {len(g.claims)} claims, at most {MAX_CLAIMS}; no IMEX domain")
            continue
        if len(nodes) >= 2:  # only a group that needs a domain counts against the namespace's cap
            per_ns[g.namespace] = per_ns.get(g.namespace, 0) + 1
            if per_ns[g.namespace] > max_per_namespace:
                refusals += _refuse(
                    g,
                    f"{KIND} {key}: namespace {g.namespace} already has {max_per_namespace} IMEX groups across "
                    "nodes, its most; no IMEX domain (it is planned when one of them ends)",
                )
                continue
        out.append(
            PlacedGang(
                uid=uid,
                key=key,
                since=g.since,
                nodes=nodes,
                cliques={n: cliques.get(n, "") for n in nodes},
                channel=channels.get(uid),
                kind=KIND,
            )
        )
        members[uid] = GangMembers(namespace=g.namespace, name=g.name, claims=tuple(g.claims))
    return Groups(tuple(out), members, tuple(refusals))


def plan_refusals(refused: Mapping[str, str], members: Mapping[str, GangMembers]) -> list[Refusal]:
    """The plan's (or the renderer's) refusals of groups, as Events on each of their claims."""
    out: list[Refusal] = []
    for uid, why in sorted(refused.items()):
        if imex_group.is_group(uid) and uid in members:
            m = members[uid]
            out += [Refusal(m.namespace, c.name, c.uid, "ImexGroupRefused", why) for c in m.claims]
    return out
