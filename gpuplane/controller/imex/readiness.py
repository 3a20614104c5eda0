"""The daemons' readiness as the drivers report it in ``ImexDomain`` status: what the gangs are told. Pure.

Each node's driver writes its own entry of ``status.nodes`` (``ready``, ``message``, ``observedGeneration``;
:mod:`gpuplane.driver.sharing.imex_runner`). The leader's IMEX pass reads the objects anyway; from them:

- :func:`node_states`: per node of a domain, ready (for the current spec) or not and why; a node with no
  entry is "no report from its driver yet";
- :func:`unready_by_gang`: for each gang whose domain has any report, the nodes not ready. A domain with no
  report at all is **unknown**, not unready: a cluster whose drivers run no daemons (``--imex-daemons=off``,
  host-managed IMEX) never reports, and its gangs must not be released for it;
- :func:`advance`: the Events of one pass against the previous one, on every gang of the domain: a node
  whose driver said ready and says not ready any more (Warning ``ImexNodeNotReady``, with its driver's
  message: a daemon that exited and is being restarted, a lost peer; a new generation not yet confirmed is
  no Event), back to ready (Normal ``ImexNodeReady``), and the domain ready on every node (Normal
  ``ImexDomainReady``: the first time, again after a node was lost or a new spec confirmed). A domain the
  previous pass did not see gets no Event (a new leader's first pass says nothing about what happened before
  it); one seen without any report (just created: the pass records the domains it creates) does;
- :func:`overdue`: the **readiness bound**. A placed gang not yet running whose domain is still not ready on
  every node ``timeout_s`` after ``placedAt`` is released the way a placement the scheduler never follows is
  (:mod:`gpuplane.controller.gang.unbound`): member pods and claims deleted, phase ``Preempted``, reason
  ``ImexNotReady``, a Warning Event naming the nodes and why; the pods' owner recreates them gated and the
  gang queues again (hand-written pods are not recreated). A gang whose members all run is never released
  for readiness: its containers hold their channel, and a lost node is what ``ImexNodeNotReady`` says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuplane.api import imex, kubetime

NOT_READY = "ImexNodeNotReady"
READY_AGAIN = "ImexNodeReady"
DOMAIN_READY = "ImexDomainReady"
RELEASED = "ImexNotReady"
TIMEOUT_S = 300.0
"""Default readiness bound (``--imex-ready-timeout``), from ``placedAt``."""
NO_REPORT = "no report from its driver yet"

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class NodeState:
    ready: bool
    message: str = ""
    seen_ready: bool = False  # ready in this pass or an earlier one of this leader (see :func:`advance`)
    said_ready: bool = False  # the driver's entry says ready, for whichever generation (what Events follow)


@dataclass(frozen=True)
class GangEvent:
    """An Event for one gang (``gang``: the domain's entry, for its namespace, name and uid)."""

    gang: imex.Gang
    type: EventType
    reason: str
    message: str


def node_states(domain: imex.ImexDomain) -> dict[str, NodeState]:
    """Per node of the domain: ready for its current generation, or not and why."""
    entries = {s.node: s for s in domain.status}
    out: dict[str, NodeState] = {}
    for node in domain.nodes:
        entry = entries.get(node)
        if entry is None:
            out[node] = NodeState(False, NO_REPORT)
        elif entry.observedGeneration < domain.generation:
            why = f"its daemon serves generation {entry.observedGeneration}, not {domain.generation} yet"
            out[node] = NodeState(False, entry.message or why, said_ready=entry.ready)
        else:
            why = "" if entry.ready else (entry.message or "not ready")
            out[node] = NodeState(entry.ready, why, said_ready=entry.ready)
    return out


def unready_by_gang(domains: Iterable[imex.ImexDomain]) -> dict[str, dict[str, str]]:
    """Gang uid -> {node: why} of its domain's nodes not ready (domains without any report left out)."""
    out: dict[str, dict[str, str]] = {}
    for domain in domains:
        if not domain.status:
            continue
        waiting = {n: s.message for n, s in node_states(domain).items() if not s.ready}
        for gang in domain.gangs:
            out[gang.uid] = waiting
    return out


def _seen(prev: Mapping[str, NodeState] | None, node: str) -> bool:
    return bool(prev and node in prev and prev[node].seen_ready)


def advance(
    before: Mapping[str, Mapping[str, NodeState]], domains: Iterable[imex.ImexDomain]
) -> tuple[dict[str, dict[str, NodeState]], list[GangEvent]]:
    """This pass's node states (to pass as ``before`` next time) and its Events (module docstring), in order.

    A state remembers whether the node was ever ready (``seen_ready``): "ready again" is said only of a node that
    was ready, went not ready and came back, not of every node of a domain starting up."""
    states: dict[str, dict[str, NodeState]] = {}
    out: list[GangEvent] = []
    for domain in sorted(domains, key=lambda d: d.name):
        prev = before.get(domain.name)
        if not domain.status:
            states[domain.name] = {}  # seen, nothing reported yet: its first report is a change
            continue
        now = {
            n: NodeState(s.ready, s.message, s.said_ready or _seen(prev, n), s.said_ready)
            for n, s in node_states(domain).items()
        }
        states[domain.name] = now
        if prev is None:
            continue
        told: list[tuple[EventType, str, str]] = []
        for node in domain.nodes:
            was, became = prev.get(node), now[node]
            # What the driver says, not the generation: a spec change (a gang added) is served within a tick
            if was is None or was.said_ready == became.said_ready:
                continue
            if was.said_ready:
                told.append(
                    (
                        "Warning",
                        NOT_READY,
                        f"IMEX daemon on node {node} is not ready any more: {became.message}. New member prepares "
                        f"on domain {domain.name} wait for it; running members' cross-node memory with {node} may "
                        "fail until it is back",
                    )
                )
            elif was.seen_ready:
                told.append(("Normal", READY_AGAIN, f"IMEX daemon on node {node} is ready again"))
        if all(s.ready for s in now.values()) and (not prev or not all(s.ready for s in prev.values())):
            nodes = ", ".join(domain.nodes)
            told.append(("Normal", DOMAIN_READY, f"IMEX domain {domain.name} ready on every node ({nodes})"))
        out.extend(GangEvent(g, t, r, m) for g in domain.gangs for t, r, m in told)
    return states, out


def overdue(
    unready: Mapping[str, str] | None,
    prev: Mapping[str, Any],
    running: int,
    members: int,
    *,
    now: float,
    timeout_s: float,
) -> str | None:
    """Why the gang is released now for its domain's readiness, or None (see the module docstring).

    ``unready``: its domain's nodes not ready and why (None: ready, or nothing reported)."""
    placed_at = kubetime.epoch(prev.get("placedAt"))
    if timeout_s <= 0 or not unready or placed_at is None or running >= members:
        return None
    waited = now - placed_at
    if waited <= timeout_s:
        return None
    nodes = "; ".join(f"{n}: {why}" for n, why in sorted(unready.items()))
    return (
        f"the IMEX domain is not ready on every node {waited:.0f}s after placement (readiness bound "
        f"{timeout_s:.0f}s; not ready: {nodes}): the placement is released (member pods and claims deleted) and the "
        "gang queues again when its pods are recreated; check the nodes' gpuplane-driver logs and imex-daemon.log"
    )
