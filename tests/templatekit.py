"""Builders for gangs whose pods come from a template: Job pods, Jobs, template claims, a World, a decision.

Shared by the template-gang tests (``test_gang_templates``, ``test_gang_timeout``); the
``cluster_slices`` fixture is imported by them with ``# noqa: F401``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpuplane.controller import deviceclass, names
from gpuplane.controller.gang import membership, owners, placement_record, queue_runner, world
from gpuplane.controller.gang import reconciler as gang_reconciler
from gpuplane.placement import model
from gpuplane.placement.policies import make as make_policy
from tests import controllerkit
from tests.controllerkit import GB200, GPU_CLASS, T0, gang_body

NS = "team-a"


@pytest.fixture(scope="module", name="cluster_slices")
def cluster_slices_fixture(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two HGX H100 nodes and four GB200 trays of one rack, as the real driver publishes them."""
    return controllerkit.cluster_slices(tmp_path_factory.mktemp("sim"))


def job_pod(
    gang: str,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str = "Pending",
    gated: bool = True,
    node: str = "",
    claims: tuple[str, ...] = (),
    controlled: bool = True,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "labels": {names.LABEL_GANG: gang, **(labels or {})},
        "annotations": dict(annotations or {}),
    }
    if controlled:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": gang, "controller": True}]
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "four"}],
        "schedulingGates": [{"name": names.SCHEDULING_GATE}] if gated else [],
    }
    if node:
        spec["nodeName"] = node
    st: dict[str, Any] = {"phase": phase}
    if claims:
        st["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": c} for c in claims]
    return {"metadata": meta, "spec": spec, "status": st}


def indexed(gang: str, i: int, **kw: Any) -> dict[str, Any]:
    return job_pod(gang, f"{gang}-{i}-x", labels={membership.COMPLETION_INDEX: str(i)}, **kw)


def job(name: str, gang: str, *, failed: bool = False, suspend: bool = False, jobset: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}"}
    if jobset:
        meta["ownerReferences"] = [
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "name": jobset,
                "uid": "js",
                "controller": True,
            }
        ]
    conditions = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"suspend": suspend, "template": {"metadata": {"labels": {names.LABEL_GANG: gang}}}},
        "status": {"conditions": conditions if failed else []},
    }


def template_claim(name: str, count: int = 4, *, node: str = "", gpus: tuple[str, ...] = ()) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.gpuplane.dev", "count": count}}]
            }
        },
        "status": {},
    }
    if node:
        claim["status"]["allocation"] = {
            "devices": {"results": [{"driver": "gpu.gpuplane.dev", "pool": node, "device": g} for g in gpus]}
        }
    return claim


def decision_of(nodes: dict[int, str]) -> model.Decision:
    return model.Decision(
        request_id="team-a/g",
        members=tuple(
            model.MemberPlacement(member=i, node=n, domain="d", gpus=tuple(f"{n}/gpu-{k}" for k in range(4)))
            for i, n in sorted(nodes.items())
        ),
    )


def world_of(
    slices: list[dict[str, Any]],
    gang: dict[str, Any],
    pods: list[dict[str, Any]],
    claims: list[dict[str, Any]],
    jobs: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> world.World:
    nodes = {s["spec"]["nodeName"]: True for s in slices if s["spec"].get("nodeName")}
    return world.World(
        gangs=controllerkit.gang_index([gang]),
        pods=world.member_lists(controllerkit.pod_index(pods)),
        claims=controllerkit.claim_index(claims),
        slices=tuple(slices),
        nodes=nodes,
        classes={"gpu.gpuplane.dev": deviceclass.view(GPU_CLASS)},
        jobs=owners.jobs_by_gang(jobs),
    )


def running_gang() -> dict[str, Any]:
    placement = placement_record.placement_status(decision_of({0: "nvl-0", 1: "nvl-1"}))
    return gang_body(
        "g",
        members=2,
        gpusPerMember=4,
        tensorParallelSize=8,
        selectors=[GB200],
        status_={"phase": "Running", "placement": placement, "domain": "d"},
    )


def decide(w: world.World, key: str = f"{NS}/g", now: float = T0 + 10) -> gang_reconciler.Outcome:
    """One queue pass and the reconcile of gang ``key``, as the controller runs them."""
    view = world.cluster_view(w)
    plan = queue_runner.plan(
        world.entries(w, view), view, lambda e: world.admit_for(w, e.spec).predicate, make_policy("gpuplane"), now=now
    )
    return gang_reconciler.decide(
        key,
        w.gangs[key],
        w,
        planned=lambda: (plan, view),
        domains=lambda: world.gpu_domains(w),
        now=now,
        settings=gang_reconciler.Settings(),
    )
