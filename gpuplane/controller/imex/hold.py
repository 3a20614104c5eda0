"""Whether a placed gang's gates wait for its IMEX domain: a pure decision over the last IMEX pass's snapshot.

kubelet prepares a member's claim as soon as its pod is scheduled, and the driver gives the claim a channel
only when an ``ImexDomain`` names it then (:mod:`gpuplane.driver.prepare.imex_claims`). A gang's gates are
therefore held until the leader's IMEX pass (:mod:`.reconcile`) has written a domain listing every member
claim of the gang. What the pass last left in the API is a :class:`Written`, kept in :class:`ImexState`
(the runtime's state for IMEX) and read here; nothing polls.

The rule (:func:`decide`): a gang is held only when all of these hold:

- some member pod is still gated, and its placement spans **two or more nodes of one clique** (the nodes'
  GPUs all in one multi-node NVLink domain: the rule :func:`gpuplane.controller.imex.decide.plan` uses);
- ``ImexDomain`` is **served** (an install without the CRD places as before, silently: the pass logs it
  once); before this leadership term's first pass (a second after the start-up barrier or a failover)
  nothing is known, and while the last pass **failed a write** or is **stale** (``STALE_S``) what it left is
  not trusted: the gang waits for a pass that wrote its plan (within the bound, below). Lifting at once on a
  failed write, as before, let an API server restart cost a gang its channel (the chaos e2e, session 39:
  members prepared without one, then listed by the next pass); a cluster without ``gpuplane-system`` now
  places its gangs after the bound, with the Warning;
- the plan did **not refuse** the gang (cliques differ, channels exhausted, an object the parser would refuse);
- not every member claim is known and listed under the gang yet;
- the gang has waited less than the **bound** (``HOLD_MAX_S`` since ``placedAt``).

When the gates are lifted without the domain for one of these reasons (refusal, bound) the
gang gets a Warning Event saying why and that its members run without an IMEX channel (:attr:`Hold.note`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Self

from gpuplane.controller import config, events, indexed, names
from gpuplane.controller.gang import writes
from gpuplane.controller.gang.membership import Members
from gpuplane.controller.gang.outcome import GangRead
from gpuplane.controller.imex import gangs
from gpuplane.placement import model

STALE_S = 90.0
"""A pass older than this is not trusted (a leader passes every ``reconcile.RESYNC_S`` = 30 s at least)."""
HOLD_MAX_S = 60.0
"""A gang waits at most this long (from ``placedAt``) for its domain; then its gates are lifted, with a Warning."""

WAITING = "WaitingForImexDomain"
LATE = "ImexDomainLate"
REFUSED = "ImexRefused"


@dataclass(frozen=True)
class Written:
    """What the leader's last IMEX pass left in the API, as the gang reconcile needs it."""

    at: float  # wall-clock time of the pass
    served: bool = True  # the API serves ImexDomains to the controller
    failed: str = ""  # why the API does not match the pass's plan ("": it does)
    listed: Mapping[str, frozenset[str]] = field(default_factory=dict)  # gang uid -> claim uids its domain lists
    refused: Mapping[str, str] = field(default_factory=dict)  # gang uid -> why the plan gives it no domain
    # gang uid -> {node: why} of its domain's nodes not ready, as last read (readiness.unready_by_gang)
    unready: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


NOT_SERVED = Written(at=0.0, served=False)
"""No IMEX in the cluster (no CRD): no gang waits. ``None`` instead means nothing is known yet: gangs wait."""


@dataclass
class ImexState:
    """The runtime's record of the last IMEX pass (``rt.state(ImexState)``): written by the pass, read by gangs."""

    written: Written | None = None  # None until this term's first pass

    @classmethod
    def create(cls, cfg: config.ControllerConfig) -> Self:
        """Nothing known at start."""
        return cls()

    def new_term(self) -> None:
        """An earlier term's pass says nothing of what is written now."""
        self.written = None


@dataclass(frozen=True)
class Hold:
    """``wait``: why the gates stay ("" : lift them); ``note``: an Event (reason, message) for lifting them
    without the gang's domain."""

    wait: str = ""
    note: tuple[str, str] | None = None

    def event(self) -> tuple[events.EventType, str, str] | None:
        return ("Warning", *self.note) if self.note else None


NO_HOLD = Hold()


def spans_one_clique(nodes: Sequence[str], cliques: Mapping[str, str]) -> bool:
    """Two or more nodes whose GPUs are all in one multi-node NVLink clique."""
    distinct = set(nodes)
    found = {cliques.get(n, "") for n in distinct}
    return len(distinct) >= 2 and len(found) == 1 and "" not in found


def decide(
    gang_uid: str,
    claims: Sequence[str | None],
    written: Written | None,
    *,
    since: float,
    now: float,
    hold_max_s: float = HOLD_MAX_S,
) -> Hold:
    """For a gated gang spanning nodes of one clique: hold, lift, or lift and say why (module docstring).

    ``claims``: the uid of every member claim (None for one not created or not indexed yet)."""
    without = "its members run without an IMEX channel"
    if written is None:
        return _bounded("waiting for the leader's first IMEX pass", since, now, hold_max_s)
    if not written.served:
        return NO_HOLD
    if written.failed:  # a write that failed once (an API server restart) must not cost the gang its channel
        return _bounded(
            f"waiting for an IMEX pass that writes its plan (the last: {written.failed})", since, now, hold_max_s
        )
    if now - written.at > STALE_S:
        why = f"waiting for a fresh IMEX pass (the last wrote its plan {now - written.at:.0f}s ago)"
        return _bounded(why, since, now, hold_max_s)
    if gang_uid in written.refused:
        return Hold(note=(REFUSED, f"no IMEX domain for this gang: {written.refused[gang_uid]}; {without}"))
    listed = written.listed.get(gang_uid, frozenset())
    have = sum(1 for c in claims if c is not None and c in listed)
    if claims and have == len(claims):
        return NO_HOLD
    counted = f"{have} of {len(claims)} member claims listed"
    return _bounded(f"waiting for the IMEX domain to list every member claim ({counted})", since, now, hold_max_s)


def _bounded(waiting: str, since: float, now: float, hold_max_s: float) -> Hold:
    """Wait, or past the bound lift the gates with a Warning saying what was still awaited."""
    if now - since >= hold_max_s:
        why = f"gates lifted after {hold_max_s:.0f}s without an IMEX domain (still {waiting})"
        return Hold(note=(LATE, f"{why}; its members run without an IMEX channel"))
    return Hold(wait=f"{waiting}; at most {hold_max_s:.0f}s")


def member_claims(namespace: str, gang: str, members: Members, decision: model.Decision) -> list[str]:
    """The names of the member claims the placement's members use (a template member's: its pod's)."""
    out: list[str] = []
    for m in decision.members:
        pod = members.by_index.get(m.member)
        if pod is not None and pod.templated:
            out.extend(pod.claims or (f"<member {m.member}'s claims>",))  # none yet: never listed, so held
        else:
            out.append(names.claim_name(gang, m.member))
    return out


def for_gang(
    g: GangRead,
    decision: model.Decision,
    *,
    claims: Mapping[str, indexed.ClaimView],
    gpu_domains: Mapping[str, str],
    written: Written | None,
    since: float,
    now: float,
) -> Hold:
    """:func:`decide` for gang ``g`` (``claims``: the claim index; ``gpu_domains``: GPU id -> NVLink domain)."""
    members = g.members
    if (written is not None and not written.served) or not any(p.gated for p in members.by_index.values()):
        return NO_HOLD
    nodes = [m.node for m in decision.members]
    placed_on = set(nodes)
    cliques = gangs.node_cliques({gpu: d for gpu, d in gpu_domains.items() if gpu.split("/", 1)[0] in placed_on})
    if not spans_one_clique(nodes, cliques):
        return NO_HOLD
    ns, name = g.ref.namespace, g.ref.name
    found = (claims.get(f"{ns}/{c}") for c in member_claims(ns, name, members, decision))
    uids = [c.uid if c is not None and c.uid else None for c in found]
    return decide(g.ref.uid, uids, written, since=since, now=now)


def apply_steps(
    g: GangRead,
    decision: model.Decision,
    *,
    claims: Mapping[str, indexed.ClaimView],
    gpu_domains: Mapping[str, str],
    written: Written | None,
    since: float,
    now: float,
) -> tuple[GangRead, writes.ApplyPlan, str]:
    """:func:`gpuplane.controller.gang.writes.apply_steps` with the gates held as :func:`for_gang` says: the gang
    (with the Warning when its gates are lifted without its domain), the plan, and the status reason for a
    plan with steps (``WaitingForImexDomain`` when the hold is what blocks, else ``Applying``)."""
    held = for_gang(g, decision, claims=claims, gpu_domains=gpu_domains, written=written, since=since, now=now)
    spec = g.spec
    applied = writes.apply_steps(
        g.ref, spec, decision, g.members, g.claims, driver_profile=spec.migProfile, hold=held.wait
    )
    if applied.lifts_gates and (note := held.event()) is not None:
        g = g.with_event(note)
    return g, applied, WAITING if held.wait and applied.blocked == held.wait else "Applying"
