"""A gang's placement or release as the all-or-nothing sequence of idempotent API writes.

Members come from :mod:`gpuplane.controller.gang.membership`; the objects written from
:mod:`gpuplane.controller.gang.desired`.

Applying a placement is a list of :class:`~gpuplane.controller.steps.Step` computed from what the API
shows now, in this order: the decision is already in the gang's status (the
caller writes it first), then every member's claim is created (deterministic
name, ownerReference to the gang, the decision id in an annotation; none for a
member made from a template, whose claims come with its pod), then
every pod's required node affinity is narrowed to its node, then every gate is
lifted. A step that is already done is not emitted, so recomputing the list
after a crash at any point yields exactly the remaining writes; gates are only
lifted once every claim and affinity is in place, and while ``hold`` says why
not (a gang across nodes of one NVLink clique waits for its IMEX domain:
:mod:`gpuplane.controller.imex.hold`) the claims and affinities are written and the
gates wait. Pure: the writes are made by
:func:`gpuplane.controller.gang.reconciler.apply` through :mod:`gpuplane.controller.kube`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuplane.controller import names
from gpuplane.controller.gang.desired import GangRef, desired_claim, narrowed_affinity, pinned_elsewhere
from gpuplane.controller.gang.membership import MemberPod, Members
from gpuplane.controller.gang.placement_record import decision_id
from gpuplane.controller.gang.spec import GangSpec
from gpuplane.controller.steps import Eviction, Step
from gpuplane.placement import model

LIFT = "lift the gang gate"


@dataclass(frozen=True)
class ExistingClaim:
    """A claim named like a member claim, as observed."""

    name: str
    decision: str
    deleting: bool
    owned: bool  # controlled by this gang


@dataclass(frozen=True)
class ApplyPlan:
    """Steps to converge on a decision; ``blocked`` says why gates cannot be lifted (yet)."""

    steps: tuple[Step, ...]
    blocked: str = ""
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def done(self) -> bool:
        """Nothing left to write and nothing blocking."""
        return not self.steps and not self.blocked

    @property
    def lifts_gates(self) -> bool:
        """The steps lift at least one member's gate."""
        return any(s.why == LIFT for s in self.steps)


def apply_steps(
    gang: GangRef,
    spec: GangSpec,
    decision: model.Decision,
    members: Members,
    claims: Mapping[str, ExistingClaim],
    *,
    driver_profile: str | None = None,
    hold: str = "",
) -> ApplyPlan:
    """The remaining writes that make the API match ``decision`` (claims, then affinities, then gates);
    ``hold``: why the gates must wait although everything else is in place ("" : they need not)."""
    did = decision_id(decision)
    claim_steps: list[Step] = []
    affinity_steps: list[Step] = []
    gate_steps: list[Step] = []
    problems: list[str] = []
    blocked = ""
    for placement in sorted(decision.members, key=lambda m: m.member):
        cname = names.claim_name(gang.name, placement.member)
        have = claims.get(cname)
        pod = members.by_index.get(placement.member)
        if pod is None:
            # Nothing for it until its pod is back: only then is its mode known (a template member's claims
            # come with its pod; a claim made now would be a stray <gang>-<i> holding nothing, never used).
            blocked = blocked or f"member {placement.member} has no pod"
            continue
        if pod.templated:
            pass  # its claims come with the pod (template or extended resource); the scheduler allocates them
        elif have is not None and (have.decision != did or not have.owned):
            if not have.owned:
                blocked = f"claim {cname} exists and is not owned by gang {gang.name}"
                problems.append(blocked)
            elif not have.deleting:
                claim_steps.append(Step("delete-claim", cname, why=f"left from an earlier decision {have.decision}"))
                blocked = blocked or f"waiting for stale claim {cname} to go"
            else:
                blocked = blocked or f"waiting for stale claim {cname} to go"
        elif have is None:
            body = desired_claim(gang, spec, placement, did, driver_profile)
            claim_steps.append(Step("create-claim", cname, body, why=f"member {placement.member} on {placement.node}"))
        if pod.node and pod.node != placement.node:
            problems.append(f"pod {pod.name} is bound to {pod.node}, the decision says {placement.node}")
            continue
        elsewhere = pinned_elsewhere(pod.affinity, placement.node)
        if elsewhere:
            blocked = blocked or f"pod {pod.name} is already narrowed to {elsewhere}; recreate it"
            problems.append(blocked)
            continue
        if pod.gated:
            aff = narrowed_affinity(pod.affinity, placement.node)
            if aff is not None:
                affinity_steps.append(
                    Step(
                        "patch-pod",
                        pod.name,
                        [{"op": "add", "path": "/spec/affinity", "value": aff}],
                        why=f"narrow to node {placement.node}",
                    )
                )
            remaining = [{"name": g} for g in pod.gates if g != names.SCHEDULING_GATE]
            gate_steps.append(
                Step(
                    "patch-pod",
                    pod.name,
                    [
                        {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": g} for g in pod.gates]},
                        {"op": "replace", "path": "/spec/schedulingGates", "value": remaining},
                    ],
                    why=LIFT,
                )
            )
    steps = claim_steps + affinity_steps
    if hold and gate_steps and not blocked:
        blocked = hold
    if blocked:
        steps.append(Step("wait", gang.name, why=blocked))
    else:
        steps.extend(gate_steps)
    return ApplyPlan(steps=tuple(steps), blocked=blocked, problems=tuple(problems))


def release_steps(
    gang: GangRef,
    members: Members,
    claims: Iterable[str],
    grace_seconds: int | None,
    why: str,
) -> tuple[Step, ...]:
    """Writes that release a gang (timeout, preemption): delete its member pods, then its claims."""
    steps = [Step("delete-pod", p.name, grace_seconds, why=why) for p in members.by_index.values()]
    steps.extend(Step("delete-claim", c, why=why) for c in sorted(claims))
    return tuple(steps)


def eviction_steps(
    members: Iterable[MemberPod], grace_seconds: int | None, why: str, *, dry_run: bool = False
) -> tuple[Step, ...]:
    """Evict each pod through the Eviction API, pinned to its uid (a pod made again under the name is not
    evicted). A preemption's: another tenant's pods go only as their PodDisruptionBudgets allow."""
    return tuple(
        Step("evict-pod", p.name, Eviction(p.uid, grace_seconds, dry_run), why=why)
        for p in sorted(members, key=lambda m: m.index)
    )
