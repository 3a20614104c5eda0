"""A gang's placement as recorded in its status: a compact, stable form of a placement decision.

The reconciler writes the decision into the gang's status before it touches claims or pods, so
a restarted controller (or the other replica) reads it back with :func:`decision_from_status`
and converges on the same placement. Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from gpuplane.placement import model


def decision_id(decision: model.Decision) -> str:
    """A short stable id of a placement (same placement, same id, on any replica)."""
    text = ";".join(
        f"{m.member}@{m.node}:{','.join(m.gpus)}:{','.join(f'{s.gpu}/{s.profile}/{s.start}' for s in m.mig)}"
        for m in sorted(decision.members, key=lambda m: m.member)
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def device_of(gpu_id: str) -> str:
    """The device name of a GPU id ("node/gpu-3" -> "gpu-3")."""
    return gpu_id.split("/", 1)[1] if "/" in gpu_id else gpu_id


def placement_status(decision: model.Decision) -> dict[str, Any]:
    """The compact status form: member -> node and member -> devices, as string maps."""
    members: dict[str, str] = {}
    devices: dict[str, str] = {}
    for m in decision.members:
        members[str(m.member)] = m.node
        parts = [device_of(g) for g in m.gpus] + [f"{device_of(s.gpu)}:{s.profile}@{s.start}" for s in m.mig]
        devices[str(m.member)] = ",".join(parts)
    return {
        "id": decision_id(decision),
        "domains": list(decision.domains),
        "members": members,
        "devices": devices,
    }


def decision_from_status(
    request_id: str, placement: Mapping[str, Any] | None, domains_of: Mapping[str, str]
) -> model.Decision | None:
    """Inverse of :func:`placement_status`; ``domains_of`` maps GPU id -> domain (unknown GPUs keep '')."""
    if not placement or not placement.get("members"):
        return None
    out: list[model.MemberPlacement] = []
    for key, node in sorted(placement["members"].items(), key=lambda kv: int(kv[0])):
        gpus: list[str] = []
        mig: list[model.MigSlot] = []
        for part in filter(None, str((placement.get("devices") or {}).get(key, "")).split(",")):
            if ":" in part:
                dev, rest = part.split(":", 1)
                profile, _, start = rest.partition("@")
                mig.append(model.MigSlot(gpu=f"{node}/{dev}", profile=profile, start=int(start or 0)))
            else:
                gpus.append(f"{node}/{part}")
        first = gpus[0] if gpus else (mig[0].gpu if mig else "")
        out.append(
            model.MemberPlacement(
                member=int(key), node=node, domain=domains_of.get(first, ""), gpus=tuple(gpus), mig=tuple(mig)
            )
        )
    return model.Decision(request_id=request_id, members=tuple(out))
