"""Who is in a gang: the member pods, by index, and why a pod was not counted.

How a member pod joins a gang (the contract users and Job templates follow):

* label ``gpuplane.dev/gang: <gang>``;
* scheduling gate ``gpuplane.dev/gang``;
* ``spec.resourceClaims: [{name: gpus, resourceClaimName: <gang>-<i>}]`` with a
  distinct ``i`` in ``0 .. members-1``. A pod's ``resourceClaims`` cannot change
  after creation, so the pod names its claim up front; the claim itself is
  created by the controller only when the whole gang is placed (a gated pod may
  reference a claim that does not exist yet). ``i`` is the member index.

Pure: pod bodies in, :class:`Members` out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.controller import names


@dataclass(frozen=True)
class MemberPod:
    """A member pod as the controller sees it."""

    name: str
    index: int
    gated: bool
    node: str  # spec.nodeName ('' while unbound)
    phase: str
    uid: str
    affinity: Mapping[str, Any] | None
    gates: tuple[str, ...]


@dataclass(frozen=True)
class Members:
    """Member pods by index, plus why some pods were not counted."""

    by_index: Mapping[int, MemberPod]
    problems: tuple[str, ...] = ()

    def complete(self, count: int) -> bool:
        """Every index 0..count-1 has a pod."""
        return all(i in self.by_index for i in range(count))

    @property
    def bound(self) -> int:
        """Members the scheduler has bound to a node."""
        return sum(1 for p in self.by_index.values() if p.node)

    @property
    def running(self) -> int:
        """Members in phase Running."""
        return sum(1 for p in self.by_index.values() if p.phase == "Running")


def _claim_index(gang: str, pod: Mapping[str, Any]) -> int | None:
    pattern = re.compile(rf"^{re.escape(gang)}-(\d+)$")
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        m = pattern.match(str(ref.get("resourceClaimName") or ""))
        if m:
            return int(m.group(1))
    return None


def members_of(gang: str, member_count: int, pods: Iterable[Mapping[str, Any]]) -> Members:
    """Member pods of ``gang``: live pods with the gang label and a claim named ``<gang>-<i>``."""
    by_index: dict[int, MemberPod] = {}
    problems: list[str] = []
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if (meta.get("labels") or {}).get(names.LABEL_GANG) != gang:
            continue
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        name = meta.get("name", "")
        index = _claim_index(gang, pod)
        if index is None:
            problems.append(f"pod {name} has no resourceClaims entry with resourceClaimName {gang}-<index>")
            continue
        if index >= member_count:
            problems.append(f"pod {name} claims member index {index}, but the gang has {member_count} members")
            continue
        if index in by_index:
            problems.append(f"pods {by_index[index].name} and {name} both claim member index {index}")
            continue
        gates = tuple(g.get("name", "") for g in spec.get("schedulingGates") or [])
        by_index[index] = MemberPod(
            name=name,
            index=index,
            gated=names.SCHEDULING_GATE in gates,
            node=spec.get("nodeName") or "",
            phase=status.get("phase") or "Pending",
            uid=meta.get("uid", ""),
            affinity=spec.get("affinity"),
            gates=gates,
        )
    return Members(by_index=by_index, problems=tuple(problems))


def gang_claim_names(gang: str, claim_names: Sequence[str]) -> list[str]:
    """Which of ``claim_names`` are member claims of ``gang``."""
    pattern = re.compile(rf"^{re.escape(gang)}-\d+$")
    return [c for c in claim_names if pattern.match(c)]
