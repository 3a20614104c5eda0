"""Which nodes form IMEX domains, and which channel each gang gets: a pure plan over the placed gangs.

Facts it rests on (``../shared/reference/imex.md``): one ``nvidia-imex`` daemon per node (one OS instance
joins one domain); a domain's daemons list each other and are ready only together; processes that open the
same IMEX channel can import each other's memory, so a channel is the isolation boundary inside a domain;
``NVreg_ImexChannelCount`` channels (default 2048) exist on every node; channel 0 is what NVIDIA gives
every workload, so gpuplane never hands it out.

The rules:

- Only gangs whose members sit on **two or more nodes of one clique** need IMEX; a gang inside one node
  uses NVLink peer-to-peer and gets nothing here. A gang whose nodes are not all in one clique is refused
  with a reason (placement keeps a gang inside one NVLink domain, so this is a stale or hand-made record).
- **Domains are the connected components** of "two gangs share a node" within a clique: gangs on disjoint
  nodes get domains of their own (a node failing in one does not stall the other), and gangs that share a
  node share that node's one daemon, so they must share its domain.
- **Channels are unique per clique** and stable: a gang keeps the channel it was given for as long as it
  is in the plan, so two domains that merge never make a running gang change channel; a new gang gets
  the lowest free channel from 1. Unique per clique is enough for isolation (a node is in one clique) and
  never short: an NVL72 clique has 72 GPUs, so at most 36 multi-node gangs at once, against 2047
  channels.
- A domain is named after its oldest gang (the one that sorts first by ``since`` then uid), so it keeps
  its name while gangs join it and its daemons keep running.
- **IMEX groups** (claims labelled ``gpuplane.dev/imex-group``, :mod:`gpuplane.controller.imex.groups`) are
  planned as gangs are (``kind="IMEX group"``), with two precedences for gangs: a new gang gets a channel
  before a new group, and a domain that would list more than ``max_entries`` entries (the object's bound,
  ``gpuplane.api.imex.MAX_GANGS``) loses its youngest groups (refused with why), never a gang, so tenants'
  labels cannot make a gang's domain unwritable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuplane.api import imex, names

CHANNEL_COUNT = names.IMEX_CHANNEL_COUNT
"""Channels 1..CHANNEL_COUNT-1 are handed out."""


@dataclass(frozen=True)
class PlacedGang:
    """A gang as placed: its nodes and their cliques, and the channel it already has (if any)."""

    uid: str
    key: str  # namespace/name, for messages
    since: float  # when it was placed (orders the gangs of a domain; ties by uid)
    nodes: tuple[str, ...]
    cliques: Mapping[str, str]  # node -> clique id ("" for a node without multi-node NVLink)
    channel: int | None = None
    kind: str = "gang"  # "gang", or "IMEX group" (hand-placed claims with the group label): messages, precedence


@dataclass(frozen=True)
class Domain:
    """One IMEX domain: the daemons of ``nodes`` list each other."""

    name: str
    clique: str
    nodes: tuple[str, ...]  # sorted
    gangs: tuple[str, ...]  # uids, oldest first


@dataclass(frozen=True)
class Plan:
    """The domains, each gang's channel, and the gangs refused with why."""

    domains: tuple[Domain, ...]
    channels: Mapping[str, int]
    refused: Mapping[str, str]

    def domain_of(self, gang_uid: str) -> Domain | None:
        """The domain ``gang_uid`` is in (None: it needs none, or was refused)."""
        return next((d for d in self.domains if gang_uid in d.gangs), None)


def _clique(gang: PlacedGang) -> tuple[str | None, str]:
    """(the gang's clique, "") or (None, why it cannot have one)."""
    cliques = {gang.cliques.get(node, "") for node in gang.nodes}
    if len(cliques) != 1 or "" in cliques:
        named = ", ".join(f"{n}: {gang.cliques.get(n) or 'no clique'}" for n in sorted(set(gang.nodes)))
        return None, f"{gang.kind} {gang.key} spans nodes of different NVLink cliques or none ({named}); no IMEX domain"
    return cliques.pop(), ""


def _components(gangs: Sequence[PlacedGang]) -> list[list[PlacedGang]]:
    """Groups of gangs connected by shared nodes (union-find over node names)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for gang in gangs:
        first = find(gang.nodes[0])
        for node in gang.nodes[1:]:
            parent[find(node)] = first
    groups: dict[str, list[PlacedGang]] = {}
    for gang in gangs:
        groups.setdefault(find(gang.nodes[0]), []).append(gang)
    return list(groups.values())


def _fit(placed: list[PlacedGang], max_entries: int, refused: dict[str, str]) -> list[PlacedGang]:
    """``placed`` less the youngest groups of every domain with more than ``max_entries`` entries (refused)."""
    while True:
        over = [c for c in _components(placed) if len(c) > max_entries and any(g.kind != "gang" for g in c)]
        if not over:
            return placed
        for group in over:
            extra = len(group) - max_entries
            for g in [g for g in reversed(group) if g.kind != "gang"][:extra]:
                refused[g.uid] = (
                    f"{g.kind} {g.key}: the IMEX domain of nodes {', '.join(sorted(set(g.nodes)))} already lists "
                    f"{max_entries} gangs and groups, its most"
                )
        placed = [g for g in placed if g.uid not in refused]


def plan(gangs: Sequence[PlacedGang], channel_count: int = CHANNEL_COUNT, max_entries: int = imex.MAX_GANGS) -> Plan:
    """The IMEX plan for the gangs (and IMEX groups) placed now (see the module docstring for the rules)."""
    refused: dict[str, str] = {}
    by_clique: dict[str, list[PlacedGang]] = {}
    for gang in sorted(gangs, key=lambda g: (g.since, g.uid)):
        if len(set(gang.nodes)) < 2:
            continue
        clique, why = _clique(gang)
        if clique is None:
            refused[gang.uid] = why
            continue
        by_clique.setdefault(clique, []).append(gang)
    domains: list[Domain] = []
    channels: dict[str, int] = {}
    for clique, members in sorted(by_clique.items()):
        taken: set[int] = set()
        for gang in members:  # oldest first keep their channel; a duplicate (a hand-edited record) loses it
            if gang.channel is not None and 0 < gang.channel < channel_count and gang.channel not in taken:
                channels[gang.uid] = gang.channel
                taken.add(gang.channel)
        free = (c for c in range(1, channel_count) if c not in taken)
        for gang in sorted(members, key=lambda g: g.kind != "gang"):  # stable: new gangs first, oldest first
            if gang.uid in channels:
                continue
            channel = next(free, None)
            if channel is None:
                refused[gang.uid] = (
                    f"{gang.kind} {gang.key}: all {channel_count - 1} IMEX channels of clique {clique} in use"
                )
                continue
            channels[gang.uid] = channel
        placed = _fit([g for g in members if g.uid in channels], max_entries, refused)
        for uid in refused:
            channels.pop(uid, None)
        for group in _components(placed):
            oldest = group[0]  # members are oldest first, and groups keep that order
            nodes = tuple(sorted({n for g in group for n in g.nodes}))
            domains.append(Domain(f"imex-{oldest.uid}", clique, nodes, tuple(g.uid for g in group)))
    return Plan(tuple(domains), channels, refused)
