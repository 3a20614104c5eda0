"""The placed gangs as IMEX sees them: each gang's nodes, cliques, member claims and recorded channel. Pure.

Read from one copy of the controller's indexes (:class:`gpuplane.controller.gang.world.World`):

- a gang counts while it holds its placement (``Placing``, ``Placed``, ``Scheduled``, ``Running``) and its
  status records one (:mod:`gpuplane.controller.gang.placement_record`); an ended, released, preempted or
  deleted gang is not in the list, so its domain goes (or shrinks) on the next pass;
- its **member claims**: a named member's ``<gang>-<index>`` claim, a template member's claims (those its pod
  was given), each with its uid from the claim index (:class:`gpuplane.controller.indexed.ClaimView`); a claim
  not in the index yet is left out (it joins the object on a later pass, when its event has bumped the index
  version). A claim sits on the node its allocation's pool names (the driver publishes one pool per node, named
  after it), else on the node the placement decided;
- its **nodes**: every node of the placement and of the allocations; a node's **clique** is the NVLink domain
  of its GPUs when they are all in one (a GB200 tray's four GPUs are in its rack's clique), else "" (no
  multi-node NVLink there, and :func:`gpuplane.controller.imex.decide.plan` refuses a gang across such nodes);
- its **channel**: the one the ``ImexDomain`` objects that exist give it (parsed with the driver's own
  parser), so a gang keeps its channel across passes, restarts and a new leader.

A gang with no member claim known yet is left out of the plan (an object must list one claim per gang at
least); it gets its domain on the pass after its first claim appears.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import imex, kubetime
from gpuplane.controller import names
from gpuplane.controller.gang import placement_record, world
from gpuplane.controller.gang.view import GangView
from gpuplane.controller.imex import groups
from gpuplane.controller.imex.decide import PlacedGang
from gpuplane.controller.imex.objects import GangMembers


@dataclass(frozen=True)
class Placed:
    """What the plan and the renderer need: the gangs placed now, and each one's member claims (by gang uid)."""

    gangs: tuple[PlacedGang, ...]
    members: Mapping[str, GangMembers]


def node_cliques(gpu_domains: Mapping[str, str]) -> dict[str, str]:
    """Node -> the NVLink domain of all its GPUs ("" when they are in several); ``gpu_domains``: GPU id -> domain."""
    seen: dict[str, set[str]] = {}
    for gpu_id, domain in gpu_domains.items():
        node = gpu_id.split("/", 1)[0]
        seen.setdefault(node, set()).add(domain)
    return {node: next(iter(d)) if len(d) == 1 else "" for node, d in seen.items()}


def recorded_channels(objects: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Gang uid -> the channel the existing objects give it (an object the parser refuses gives none)."""
    out: dict[str, int] = {}
    for obj in objects:
        domain, _ = imex.parse_domain(dict(obj))
        if domain is None:
            continue
        for gang in domain.gangs:
            out.setdefault(gang.uid, gang.channel)
    return out


def _claim_names(w: world.World, key: str, gang: GangView, member: int) -> tuple[str, ...]:
    spec = gang.spec
    pod = w.members(key, spec.members).by_index.get(member) if spec is not None else None
    if pod is not None and pod.templated:
        return pod.claims
    return (names.claim_name(key.split("/", 1)[1], member),)


def placed(w: world.World, gpu_domains: Mapping[str, str], channels: Mapping[str, int]) -> Placed:
    """Every gang holding a placement, with its member claims known so far (see the module docstring)."""
    cliques = node_cliques(gpu_domains)
    gangs: list[PlacedGang] = []
    members: dict[str, GangMembers] = {}
    for key, gang in sorted(w.gangs.items()):
        st, uid = gang.status, gang.uid
        if gang.phase not in world.HOLDING_PHASES or not uid or gang.deleting:
            continue
        try:
            decision = placement_record.decision_from_status(key, st.get("placement"), gpu_domains)
        except (ValueError, TypeError, AttributeError):  # a status no replica wrote: no gang of IMEX's
            continue
        if decision is None:
            continue
        ns, name = key.split("/", 1)
        nodes: list[str] = []
        claims: list[imex.Claim] = []
        for m in decision.members:
            nodes.append(m.node)
            for cname in _claim_names(w, key, gang, m.member):
                claim = w.claims.get(f"{ns}/{cname}")
                if claim is None or not claim.uid:
                    continue
                node = groups.pool_node(claim) or m.node
                nodes.append(node)
                claims.append(imex.Claim(namespace=ns, name=cname, uid=claim.uid, node=node))
        if not claims:
            continue
        since = kubetime.epoch(st.get("placedAt")) or gang.created
        here = tuple(sorted(set(nodes)))
        gangs.append(
            PlacedGang(
                uid=uid,
                key=key,
                since=since,
                nodes=here,
                cliques={n: cliques.get(n, "") for n in here},
                channel=channels.get(uid),
            )
        )
        members[uid] = GangMembers(namespace=ns, name=name, claims=tuple(claims))
    return Placed(tuple(gangs), members)
