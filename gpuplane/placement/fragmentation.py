"""Fragmentation against a size mix (after FGD, USENIX ATC '23), extended to MIG and NVLink domains.

For a request shape r drawn from the mix with probability w_r, the fragment of a
domain is the free capacity (GPU units; free MIG compute slices count as
sevenths) that r cannot use:

* one MIG instance of profile p: a GPU's free capacity counts when the GPU has
  no free placement of p;
* one whole GPU: the free capacity of every partly used GPU;
* a TP group of m members x g whole GPUs: when the domain cannot host the group,
  all its free capacity; otherwise the free capacity of partly used GPUs plus the
  empty GPUs on nodes with fewer than g empty GPUs.

Fragmentation = sum over domains of sum_r w_r * fragment_r. It splits into a
per-GPU term ``gpu_term(state)`` and a per-domain term ``domain_term(signature)``,
each memoised, so the whole cluster's value is a sum over index entries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuplane.placement import geometry, model, snapshot


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """A request shape of the mix: one MIG instance, or a TP group of ``members`` x ``gpus_per_member``."""

    mig_profile: str = ""
    gpus_per_member: int = 1
    members: int = 1

    @property
    def multi(self) -> bool:
        """Needs more than one whole GPU."""
        return not self.mig_profile and self.gpus_per_member * self.members > 1

    def label(self) -> str:
        """Short human name: ``3g``, ``1gpu``, ``tp8(2x4)``."""
        if self.mig_profile:
            return self.mig_profile
        n = self.gpus_per_member * self.members
        if n == 1:
            return "1gpu"
        return f"tp{n}" if self.members == 1 else f"tp{n}({self.members}x{self.gpus_per_member})"


def shape_of(request: model.Request) -> Shape:
    """The shape of one TP group of ``request`` (a MIG request: its profile)."""
    if request.mig_profile is not None:
        return Shape(mig_profile=request.mig_profile)
    mpg = request.members_per_group
    return Shape(gpus_per_member=request.gpus_per_member, members=mpg)


@dataclass(frozen=True, slots=True)
class SizeMix:
    """Request shapes with probabilities summing to 1, in a stable order."""

    shapes: tuple[tuple[Shape, float], ...]

    @staticmethod
    def from_requests(requests: Iterable[model.Request]) -> SizeMix:
        """The empirical mix of ``requests`` (by count, as FGD does)."""
        counts: dict[Shape, int] = {}
        for r in requests:
            s = shape_of(r)
            counts[s] = counts.get(s, 0) + 1
        return SizeMix.from_counts(counts)

    @staticmethod
    def parse(text: str) -> SizeMix:
        """``"1g=0.5,3g=5.5,1gpu=75,tp8=0.6,tp8(2x4)=1"`` (shape labels, as ``Shape.label`` writes them, and weights).

        ValueError names the item that is not ``LABEL=WEIGHT`` with a known label and a weight >= 0.
        """
        counts: dict[Shape, float] = {}
        for item in filter(None, (x.strip() for x in text.split(","))):
            label, _, weight = item.partition("=")
            try:
                w = float(weight)
            except ValueError:
                raise ValueError(f"mix item {item!r}: expected LABEL=WEIGHT, e.g. 3g=5.5") from None
            if w < 0:
                raise ValueError(f"mix item {item!r}: the weight must be >= 0")
            counts[_shape_of_label(label.strip())] = counts.get(_shape_of_label(label.strip()), 0.0) + w
        return SizeMix.from_counts(counts)

    @staticmethod
    def from_counts(counts: Mapping[Shape, float]) -> SizeMix:
        """Normalise ``counts``; an empty mix is allowed (then fragmentation is 0)."""
        total = float(sum(counts.values()))
        if total <= 0:
            return SizeMix(())
        return SizeMix(tuple((s, counts[s] / total) for s in sorted(counts) if counts[s] > 0))


def _shape_of_label(label: str) -> Shape:
    m = re.fullmatch(r"(\d+g(?:\+me|\.\d+m)?)|1gpu|tp(\d+)(?:\((\d+)x(\d+)\))?", label)
    if m is None:
        raise ValueError(f"unknown shape {label!r}: expected e.g. 1g, 3g, 1g.2m, 1gpu, tp4, tp8(2x4)")
    if m.group(1):
        return Shape(mig_profile=m.group(1))
    if label == "1gpu":
        return Shape()
    n = int(m.group(2))
    if m.group(3):
        members, per = int(m.group(3)), int(m.group(4))
        if members * per != n:
            raise ValueError(f"shape {label!r}: {members} x {per} is not {n} GPUs")
        return Shape(gpus_per_member=per, members=members)
    return Shape(gpus_per_member=n)


class Fragmentation:
    """Memoised fragmentation of a size mix on one geometry."""

    def __init__(self, mix: SizeMix, slots: geometry.Slots) -> None:
        self.mix = mix
        self.slots = slots
        for s, _ in mix.shapes:
            if s.mig_profile and not slots.geometry.has_profile(s.mig_profile):
                raise ValueError(f"mix shape {s.mig_profile} is not a profile of {slots.geometry.name}")
        self._single = tuple((s, w) for s, w in mix.shapes if not s.multi)
        self._multi = tuple((s, w) for s, w in mix.shapes if s.multi)
        self._multi_weight = sum(w for _, w in self._multi)
        self._gpu: dict[int, float] = {}
        self._dom: dict[snapshot.Signature, float] = {}

    def gpu_term(self, state: int) -> float:
        """Expected unusable free capacity of one GPU (its share of every shape's fragment)."""
        got = self._gpu.get(state)
        if got is None:
            free = self.slots.free_units(state)
            got = 0.0
            if free > 0 and state != geometry.EMPTY:
                for s, w in self._single:
                    usable = self.slots.can_host(state, s.mig_profile) if s.mig_profile else False
                    if not usable:
                        got += w * free
                got += self._multi_weight * free
            self._gpu[state] = got
        return got

    def domain_term(self, sig: snapshot.Signature) -> float:
        """Expected unusable empty GPUs of a domain for the multi-GPU shapes."""
        got = self._dom.get(sig)
        if got is None:
            got = 0.0
            total = sum(sig)
            for s, w in self._multi:
                g = s.gpus_per_member
                if sum(c // g for c in sig) >= s.members:
                    got += w * sum(c for c in sig if c < g)
                else:
                    got += w * total
            self._dom[sig] = got
        return got

    def of(self, snap: snapshot.Snapshot) -> float:
        """Fragmentation of the whole cluster, in GPU units."""
        total = 0.0
        for di, d in enumerate(snap.domains):
            total += self.domain_term(d.signature)
            for st, n in snap.state_counts(di).items():
                total += n * self.gpu_term(st)
        return total


def largest_block(sig: snapshot.Signature, node_gpus: int) -> int:
    """Largest TP group (GPUs) a domain can host: one node's empty GPUs, or all fully empty nodes."""
    if not sig:
        return 0
    full = sum(1 for c in sig if c >= node_gpus)
    return max(sig[-1], full * node_gpus)


def tp_capable(sig: snapshot.Signature, node_gpus: int, tp: int) -> bool:
    """Whether a domain with ``sig`` can host a TP group of ``tp`` GPUs (members of min(tp, node) GPUs)."""
    g = min(tp, node_gpus)
    if tp % g:
        return False
    return sum(c // g for c in sig) >= tp // g
