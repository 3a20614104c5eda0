"""Frozen value types of the placement module: cluster parts, requests, decisions.

Everything here is an immutable value; the indexed cluster view lives in
``snapshot``, the MIG slice layout in :mod:`gpuplane.mig.geometry`. Names are
stable strings (never a GPU index), so a decision can be applied by the
operator without re-deriving anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# GPU memory per model in GiB, for fair share by GPU memory (DRF).
GPU_MEMORY_GIB: dict[str, float] = {"A100-40GB": 40.0, "A100-80GB": 80.0, "H100": 80.0, "H200": 141.0, "B200": 180.0}


class MigInstance(NamedTuple):
    """A MIG instance on a GPU: profile name and start slot."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU. ``whole`` is True when allocated as a whole device; ``mig`` lists instances."""

    id: str
    node: str
    domain: str
    model: str = "H100"
    whole: bool = False
    mig: tuple[MigInstance, ...] = ()
    memory_gib: float | None = None  # as published; None: look the model up in GPU_MEMORY_GIB

    @property
    def memory(self) -> float:
        """GPU memory in GiB, for fair share by dominant resource."""
        return self.memory_gib if self.memory_gib is not None else GPU_MEMORY_GIB.get(self.model, 80.0)

    @property
    def empty(self) -> bool:
        """Nothing allocated on it: usable whole or for any MIG profile."""
        return not self.whole and not self.mig


@dataclass(frozen=True, slots=True)
class Node:
    """A node: its GPUs (stable order) and the NVLink domain it belongs to."""

    name: str
    domain: str
    gpus: tuple[Gpu, ...]
    free_whole: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "free_whole", sum(1 for g in self.gpus if g.empty))


@dataclass(frozen=True, slots=True)
class Domain:
    """An NVLink domain (HGX: one node; NVL72: 18 nodes of 4 GPUs; PCIe: one GPU).

    ``signature`` is the sorted tuple of the nodes' counts of empty GPUs: all a
    whole-GPU placement needs to know about the domain.
    """

    name: str
    nodes: tuple[Node, ...]
    signature: tuple[int, ...] = field(init=False)
    gpu_count: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "signature", tuple(sorted(n.free_whole for n in self.nodes)))
        object.__setattr__(self, "gpu_count", sum(len(n.gpus) for n in self.nodes))

    @property
    def free_whole(self) -> int:
        """Empty GPUs in the domain."""
        return sum(self.signature)


@dataclass(frozen=True, slots=True)
class Request:
    """A gang: ``members`` pods, each with ``gpus_per_member`` whole GPUs or one MIG instance.

    ``tp_size`` GPUs form one tensor-parallel group that must stay inside one
    NVLink domain. When ``tp_size`` exceeds ``gpus_per_member`` a group spans
    ``tp_size // gpus_per_member`` members. ``mig_profile`` requests one MIG
    instance per member (then ``gpus_per_member`` and ``tp_size`` must be 1).
    """

    id: str
    namespace: str = "default"
    priority: int = 0
    gpus_per_member: int = 1
    members: int = 1
    tp_size: int = 1
    mig_profile: str | None = None
    created: float = 0.0

    def __post_init__(self) -> None:
        if self.members < 1 or self.gpus_per_member < 1 or self.tp_size < 1:
            raise ValueError(f"request {self.id}: members, gpus_per_member and tp_size must be >= 1")
        if self.mig_profile is not None and (self.gpus_per_member != 1 or self.tp_size != 1):
            raise ValueError(f"request {self.id}: a MIG request takes one instance per member and tp_size 1")
        g = self.gpus_per_member
        if self.tp_size > g:
            if self.tp_size % g or self.total_gpus % self.tp_size:
                raise ValueError(
                    f"request {self.id}: tp_size {self.tp_size} must be a multiple of gpus_per_member {g}"
                    f" and divide the gang's {self.total_gpus} GPUs"
                )
        elif g % self.tp_size:
            raise ValueError(f"request {self.id}: tp_size {self.tp_size} must divide gpus_per_member {g}")

    @property
    def total_gpus(self) -> int:
        """Whole GPUs the gang needs (0 for a MIG request)."""
        return 0 if self.mig_profile is not None else self.members * self.gpus_per_member

    @property
    def members_per_group(self) -> int:
        """Members that one TP group spans (1 when a group fits inside a member)."""
        return max(1, self.tp_size // self.gpus_per_member)


@dataclass(frozen=True, slots=True)
class MigSlot:
    """One MIG instance of a decision: GPU id, profile name, start slot."""

    gpu: str
    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class MemberPlacement:
    """Where one gang member goes: node, domain, whole GPUs or MIG instances."""

    member: int
    node: str
    domain: str
    gpus: tuple[str, ...] = ()
    mig: tuple[MigSlot, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome for one request: every member placed, or refused with a reason."""

    request_id: str
    members: tuple[MemberPlacement, ...] = ()
    reason: str = ""

    @property
    def placed(self) -> bool:
        """True when every member has a placement (gangs are all or nothing)."""
        return not self.reason and bool(self.members)

    @property
    def domains(self) -> tuple[str, ...]:
        """Distinct domains used, in member order."""
        return tuple(dict.fromkeys(m.domain for m in self.members))

    @staticmethod
    def refused(request_id: str, reason: str) -> Decision:
        """A refusal carrying its reason."""
        return Decision(request_id=request_id, members=(), reason=reason)
