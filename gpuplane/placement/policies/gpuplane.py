"""gpuplane: fragmentation-gradient placement over MIG slots, nodes and NVLink domains.

Every candidate is scored by how much it raises the expected fragmentation of
the workload's size mix (``fragmentation.Fragmentation``: free capacity that a
request drawn from the mix could not use). Ties, which are common when a shape
is rare in the mix, fall to the largest free blocks: first the number of
power-of-two TP sizes the domain stops being able to host, then the tightest
GPU, the larger largest-free MIG profile left on it, the node with the fewest
empty GPUs and the domain with the fewest. So MIG instances sit where they keep
big profiles possible (a 3g at slot 4 leaves room for a 4g; a 1g goes to a slot
that no larger profile needs), fill partly used GPUs before opening empty ones,
and whole GPUs and domains stay empty for TP groups.

Queue awareness (``observe_queue``, fed by whoever runs the queue): a MIG
candidate is first scored by the *effective* gradient, the GPU term after the
requests expected to arrive have filled what they fit — a free hole that a
waiting request fits will be taken, so it is not a fragment, and a hole that
only a rare shape fits stays one. Expected are the shapes waiting now and, while
a whole-GPU request waits (the fleet is saturated), the mix's MIG shapes at
least ``expect`` (2) times as frequent as the one being placed, and a single
whole GPU for an empty GPU. Example: a 3g no longer pairs with a lone 3g (one
compute slice stranded for as long as both run) when 4g requests are waiting or
far more frequent; it opens a GPU at slot 4 and both GPUs end up 4g+3g. With
nothing waiting the effective and the plain gradient coincide, and the plain
gradient is the next key either way.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuplane.placement import fragmentation, geometry, snapshot
from gpuplane.placement.policies import base

# Mix used when the caller has not measured one: every shape the trace knows, equally likely.
PRIOR_MIX = fragmentation.SizeMix.from_counts(
    {
        fragmentation.Shape(mig_profile="1g"): 1,
        fragmentation.Shape(mig_profile="2g"): 1,
        fragmentation.Shape(mig_profile="3g"): 1,
        fragmentation.Shape(mig_profile="4g"): 1,
        fragmentation.Shape(): 1,
        fragmentation.Shape(gpus_per_member=2): 1,
        fragmentation.Shape(gpus_per_member=4): 1,
        fragmentation.Shape(gpus_per_member=8): 1,
    }
)

_DIGITS = 9  # Δ rounding, so float noise never decides a tie

# What is waiting, as far as filling a GPU goes: MIG profiles with a waiting request, and whether a
# single whole GPU is waiting.
_Waiting = tuple[frozenset[str], bool]
_NOTHING: _Waiting = (frozenset(), False)


class GpuPlane:
    """Minimise the fragmentation gradient, then protect the largest free blocks."""

    name = "gpuplane"

    def __init__(
        self,
        mix: fragmentation.SizeMix | None = None,
        expect: float | None = 2.0,
        gate: bool = True,
        hold_stranding: bool = True,
    ) -> None:
        self.mix = mix if mix is not None else PRIOR_MIX
        self.hold_stranding = hold_stranding
        self.expect = expect
        self.gate = gate
        self._weights = {s: w for s, w in self.mix.shapes}
        self._frag: dict[str, fragmentation.Fragmentation] = {}
        self._partial: dict[tuple[str, int, str, _Waiting], tuple[base.Key, int] | None] = {}
        self._empty: dict[
            tuple[str, str, snapshot.Signature, int, _Waiting], tuple[base.Key, int, int | None] | None
        ] = {}
        self._group: dict[tuple[snapshot.Signature, int, int, int], tuple[base.Key, tuple[int, ...] | None] | None] = {}
        self._caps: dict[tuple[snapshot.Signature, int], int] = {}
        self._waiting: _Waiting = _NOTHING
        self._relaxed: GpuPlane | None = None
        self._fills: dict[tuple[str, int, _Waiting], int] = {}
        self._keys: dict[tuple[object, ...], list[tuple[base.Key, int]]] = {}

    def without_hold(self) -> GpuPlane:
        """This policy without the stranding hold (same mix and queue view), kept for reuse."""
        if not self.hold_stranding:
            return self
        if self._relaxed is None:
            self._relaxed = GpuPlane(self.mix, self.expect, self.gate, hold_stranding=False)
        self._relaxed._waiting = self._waiting
        return self._relaxed

    def observe_queue(self, waiting: Mapping[fragmentation.Shape, int]) -> None:
        """Remember which shapes wait: a free hole one of them fits will be taken, so it is not a fragment."""
        profs = frozenset(s.mig_profile for s, n in waiting.items() if n > 0 and s.mig_profile)
        whole = any(n > 0 and not s.mig_profile and not s.multi for s, n in waiting.items())
        self._waiting = (profs, whole)

    def _fill(self, slots: geometry.Slots, state: int, waiting: _Waiting) -> int:
        """``state`` after the waiting requests have taken what they fit (most compute used, then lowest state)."""
        if state == geometry.WHOLE or waiting == _NOTHING:
            return state
        if state == geometry.EMPTY and waiting[1]:
            return geometry.WHOLE
        key = (slots.geometry.name, state, waiting)
        got = self._fills.get(key)
        if got is None:
            got = state
            best = (slots.free_compute(state), state)
            for prof in sorted(waiting[0]):
                for st in slots.starts(state, prof):
                    f = self._fill(slots, slots.add(state, prof, st), (waiting[0], False))
                    cand = (slots.free_compute(f), f)
                    if cand < best:
                        best, got = cand, f
            self._fills[key] = got
        return got

    def _expected(self, profile: str) -> _Waiting:
        """Shapes expected to take a hole before it matters: the waiting ones, and (``expect``) the mix's
        shapes at least ``expect`` times as frequent as ``profile``."""
        profs, whole = self._waiting
        if self.expect is None or (self.gate and not whole):
            return self._waiting
        w0 = self.expect * self._weights.get(fragmentation.Shape(mig_profile=profile), 0.0)
        more = {s.mig_profile for s, w in self.mix.shapes if s.mig_profile and w >= w0 and w > 0}
        single = self._weights.get(fragmentation.Shape(), 0.0)
        return (profs | frozenset(more), whole or (single > 0 and single >= w0))

    def _effective(
        self, slots: geometry.Slots, frag: fragmentation.Fragmentation, state: int, expected: _Waiting
    ) -> float:
        """The GPU term of ``state`` once the expected requests have filled what they fit."""
        return frag.gpu_term(self._fill(slots, state, expected))

    def measure(self, slots: geometry.Slots) -> fragmentation.Fragmentation:
        """The memoised fragmentation measure for a geometry."""
        got = self._frag.get(slots.geometry.name)
        if got is None:
            got = fragmentation.Fragmentation(self.mix, slots)
            self._frag[slots.geometry.name] = got
        return got

    def _capabilities(self, sig: snapshot.Signature, node_gpus: int) -> int:
        """How many TP sizes 2, 4, 8, ... (up to the domain size) the domain can host."""
        key = (sig, node_gpus)
        got = self._caps.get(key)
        if got is None:
            got, k, size = 0, 2, len(sig) * node_gpus
            while k <= size:
                got += fragmentation.tp_capable(sig, node_gpus, k)
                k *= 2
            self._caps[key] = got
        return got

    def _start_cands(
        self, slots: geometry.Slots, frag: fragmentation.Fragmentation, state: int, profile: str
    ) -> list[tuple[int, float, float, int, int, int, int]]:
        """Per free start: (Δ stranded compute, Δ effective and Δ plain gpu term, free compute, -largest free,
        -free placements after; start), in start order."""
        out: list[tuple[int, float, float, int, int, int, int]] = []
        h0 = frag.gpu_term(state)
        d0 = slots.stranded(state)
        expected = self._expected(profile)
        e0 = self._effective(slots, frag, state, expected)
        for s in slots.starts(state, profile):
            after = slots.add(state, profile, s)
            lf = slots.largest_free(after)
            out.append(
                (
                    slots.stranded(after) - d0,
                    round(self._effective(slots, frag, after, expected) - e0, _DIGITS),
                    round(frag.gpu_term(after) - h0, _DIGITS),
                    slots.free_compute(after),
                    -(lf.compute * 16 + lf.memory) if lf is not None else 0,
                    -slots.placements(after),
                    s,
                )
            )
        return out

    def _best_start(
        self, slots: geometry.Slots, frag: fragmentation.Fragmentation, state: int, profile: str
    ) -> tuple[int, float, float, int, int, int, int] | None:
        """The best of :meth:`_start_cands`, or None when there is no free start or (holding) every one strands."""
        cands = self._start_cands(slots, frag, state, profile)
        best = min(cands) if cands else None
        if best is not None and self.hold_stranding and best[0] > 0:
            return None  # stranding is the first key: when the best strands, every start does
        return best

    @staticmethod
    def _partial_key(b: tuple[int, float, float, int, int, int, int]) -> base.Key:
        return (float(b[0]), b[1], b[2], 0.0, float(b[3]), float(b[4]), float(b[5]), 0.0, 0.0)

    def _empty_key(
        self,
        b: tuple[int, float, float, int, int, int, int],
        frag: fragmentation.Fragmentation,
        sig: snapshot.Signature,
        c: int,
        node_gpus: int,
    ) -> base.Key:
        """The key of opening an empty GPU on a node that has ``c`` empty GPUs, in a domain with ``sig``."""
        after = base.take(sig, c, 1)
        dd = frag.domain_term(after) - frag.domain_term(sig)
        return (
            float(b[0]),
            round(b[1] + dd, _DIGITS),
            round(b[2] + dd, _DIGITS),
            float(self._capabilities(sig, node_gpus) - self._capabilities(after, node_gpus)),
            float(b[3]),
            float(b[4]),
            float(b[5]),
            float(c),
            float(sum(sig)),
        )

    def start_keys(self, slots: geometry.Slots, state: int, profile: str) -> list[tuple[base.Key, int]]:
        """(key, start) of every free ``profile`` start on a partly used GPU in ``state`` (no hold applied).

        The same keys :meth:`mig_partial` minimises; ``preference`` orders a node's published devices by them.
        """
        memo = (slots.geometry.name, state, profile, self._waiting)
        got = self._keys.get(memo)
        if got is None:
            frag = self.measure(slots)
            got = [(self._partial_key(b), b[6]) for b in self._start_cands(slots, frag, state, profile)]
            self._keys[memo] = got
        return got

    def empty_start_keys(
        self, slots: geometry.Slots, profile: str, sig: snapshot.Signature, count: int, node_gpus: int
    ) -> list[tuple[base.Key, int]]:
        """(key, start) of every ``profile`` start on an empty GPU of a node with ``count`` empty GPUs (no hold)."""
        memo = (slots.geometry.name, profile, sig, count, node_gpus, self._waiting)
        got = self._keys.get(memo)
        if got is None:
            frag = self.measure(slots)
            got = [
                (self._empty_key(b, frag, sig, count, node_gpus), b[6])
                for b in self._start_cands(slots, frag, geometry.EMPTY, profile)
            ]
            self._keys[memo] = got
        return got

    def mig_partial(self, slots: geometry.Slots, state: int, profile: str) -> tuple[base.Key, int] | None:
        # Taking slices of a partly used GPU never changes a domain's empty counts.
        key = (slots.geometry.name, state, profile, self._waiting)
        if key in self._partial:
            return self._partial[key]
        frag = self.measure(slots)
        b = self._best_start(slots, frag, state, profile)
        got = None if b is None else (self._partial_key(b), b[6])
        self._partial[key] = got
        return got

    def mig_empty(
        self, slots: geometry.Slots, profile: str, sig: snapshot.Signature, node_gpus: int
    ) -> tuple[base.Key, int, int | None] | None:
        key = (slots.geometry.name, profile, sig, node_gpus, self._waiting)
        if key in self._empty:
            return self._empty[key]
        frag = self.measure(slots)
        b = self._best_start(slots, frag, geometry.EMPTY, profile)
        got: tuple[base.Key, int, int | None] | None = None
        if b is not None and sig and sig[-1] > 0:
            for c in sorted(set(sig)):
                if c <= 0:
                    continue
                k = self._empty_key(b, frag, sig, c, node_gpus)
                if got is None or k < got[0]:
                    got = (k, b[6], c)
        self._empty[key] = got
        return got

    def group(
        self, slots: geometry.Slots, sig: snapshot.Signature, gpus_per_member: int, members: int, node_gpus: int
    ) -> tuple[base.Key, tuple[int, ...] | None] | None:
        key = (sig, gpus_per_member, members, node_gpus)
        if key in self._group:
            return self._group[key]
        got: tuple[base.Key, tuple[int, ...] | None] | None = None
        if base.group_fits(sig, gpus_per_member, members):
            frag = self.measure(slots)
            cur = sig
            chosen: list[int] = []
            for _ in range(members):
                best: tuple[float, float, int] | None = None
                d0 = frag.domain_term(cur)
                cap0 = self._capabilities(cur, node_gpus)
                for c in sorted(set(cur)):
                    if c < gpus_per_member:
                        continue
                    after = base.take(cur, c, gpus_per_member)
                    delta = frag.domain_term(after) - d0
                    cand = (round(delta, _DIGITS), float(cap0 - self._capabilities(after, node_gpus)), c)
                    if best is None or cand < best:
                        best = cand
                assert best is not None  # group_fits guarantees a node per member
                chosen.append(best[2])
                cur = base.take(cur, best[2], gpus_per_member)
            total = round(frag.domain_term(cur) - frag.domain_term(sig), _DIGITS)
            caploss = float(self._capabilities(sig, node_gpus) - self._capabilities(cur, node_gpus))
            left = float(sum(c - gpus_per_member for c in chosen))
            got = ((total, caploss, left, float(sum(cur))), tuple(chosen))
        self._group[key] = got
        return got
