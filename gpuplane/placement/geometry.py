"""MIG slot math: a GPU's occupancy as one integer, free placements, the largest free block.

A GPU *state* packs which memory slices (low bits) and compute slices (next
bits) are taken, plus one bit for the once-per-GPU ``+me`` profile. ``EMPTY``
is 0 and ``WHOLE`` marks a GPU allocated as a whole device. Every answer is
memoised per state, so policies can score thousands of candidates cheaply:
a cluster holds only a few dozen distinct states.

The layout and the coexistence rule are :mod:`gpuplane.mig.geometry`'s, the same the node
driver's create check uses: a placement's bits are its :func:`~gpuplane.mig.geometry.footprint`,
and the ``+me`` bit is the one row whose ``max_count`` is below its number of placements.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuplane.mig.geometry import MigGeometry, MigShape, footprint
from gpuplane.placement import model

EMPTY = 0
WHOLE = 1 << 30


class Slots:
    """Slot arithmetic for one :class:`MigGeometry`, memoised per state."""

    def __init__(self, geometry: MigGeometry) -> None:
        self.geometry = geometry
        self._mem = geometry.memory_slices
        self._cmp = geometry.compute_slices
        self._me_bit = 1 << (self._mem + self._cmp)
        self._full = ((1 << self._mem) - 1) | (((1 << self._cmp) - 1) << self._mem)
        self._masks: dict[tuple[str, int], int] = {}
        for p in geometry.profiles:
            if not p.exclusive and p.max_count < len(p.starts):
                # The state packs one bit for a once-per-GPU row; other counts are not representable.
                raise ValueError(f"profile {p.name}: max_count {p.max_count} below its {len(p.starts)} starts")
            for s in p.starts:
                self._masks[(p.name, s)] = footprint(geometry, p.compute, p.memory, s)
        self._by_name = {p.name: p for p in geometry.profiles}
        self._starts: dict[tuple[int, str], tuple[int, ...]] = {}
        self._largest: dict[int, MigShape | None] = {}
        self._state_of: dict[tuple[model.MigInstance, ...], int] = {}
        self._placements: dict[int, int] = {}
        self._stranded: dict[int, int] = {}
        self._clean: dict[str, int] = {}
        # Profiles that can complete a partly used GPU (7g needs an empty one).
        self._fillers = tuple(p.name for p in geometry.profiles if p.memory < self._mem)

    def profile(self, name: str) -> MigShape:
        """The profile called ``name``."""
        return self._by_name[name]

    def mask(self, profile: str, start: int) -> int:
        """Bits taken by ``profile`` at ``start``; KeyError for an invalid start."""
        return self._masks[(profile, start)]

    def state_of(self, whole: bool, instances: Iterable[model.MigInstance]) -> int:
        """The state of a GPU given its whole flag and MIG instances; ValueError on overlap."""
        if whole:
            return WHOLE
        key = tuple(instances)
        got = self._state_of.get(key)
        if got is None:
            got = EMPTY
            for inst in key:
                got = self.add(got, inst.profile, inst.start)
            self._state_of[key] = got
        return got

    def fits(self, state: int, profile: str, start: int) -> bool:
        """Whether ``profile`` at ``start`` is free in ``state``."""
        if state == WHOLE:
            return False
        key = (profile, start)
        if key not in self._masks:
            return False
        if self._by_name[profile].exclusive and state & self._me_bit:
            return False
        return not state & self._masks[key]

    def add(self, state: int, profile: str, start: int) -> int:
        """``state`` with ``profile`` placed at ``start``; ValueError when it overlaps."""
        if not self.fits(state, profile, start):
            raise ValueError(f"MIG {profile}@{start} does not fit (state {state:#x})")
        new = state | self._masks[(profile, start)]
        if self._by_name[profile].exclusive:
            new |= self._me_bit
        return new

    def remove(self, state: int, profile: str, start: int) -> int:
        """``state`` with the instance ``profile``@``start`` gone; ValueError if absent."""
        m = self._masks[(profile, start)]
        if state == WHOLE or state & m != m:
            raise ValueError(f"MIG {profile}@{start} is not allocated (state {state:#x})")
        new = state & ~m
        if self._by_name[profile].exclusive:
            new &= ~self._me_bit
        return new

    def starts(self, state: int, profile: str) -> tuple[int, ...]:
        """Free start slots for ``profile`` in ``state``, ascending."""
        key = (state, profile)
        got = self._starts.get(key)
        if got is None:
            p = self._by_name[profile]
            got = tuple(s for s in p.starts if self.fits(state, profile, s))
            self._starts[key] = got
        return got

    def can_host(self, state: int, profile: str) -> bool:
        """Whether any placement of ``profile`` is free."""
        return bool(self.starts(state, profile))

    def free_compute(self, state: int) -> int:
        """Free compute slices (0 for a whole-allocated GPU)."""
        if state == WHOLE:
            return 0
        used = (state >> self._mem) & ((1 << self._cmp) - 1)
        return self._cmp - used.bit_count()

    def free_units(self, state: int) -> float:
        """Free capacity in GPU units: free compute slices / compute slices."""
        return self.free_compute(state) / self._cmp

    def partial(self, state: int) -> bool:
        """Partly used: some MIG instance present, some compute still free."""
        return state not in (EMPTY, WHOLE) and self.free_compute(state) > 0

    def stranded(self, state: int) -> int:
        """Free compute slices that no sequence of further placements can ever use.

        MIG placements are aligned to memory slices, so some layouts strand a
        compute slice for as long as they run: on Hopper, a 3g at slot 0 takes
        memory slices 0-3 but compute slices 0-2, and compute slice 3 is only
        reachable through memory slice 3, so that slice is dead until the 3g
        goes. 0 for empty, whole and full GPUs.
        """
        if state == WHOLE:
            return 0
        got = self._stranded.get(state)
        if got is None:
            got = self.free_compute(state)
            for name in self._fillers:
                if got == 0:
                    break
                for s in self.starts(state, name):
                    got = min(got, self.stranded(self.add(state, name, s)))
                    if got == 0:
                        break
            self._stranded[state] = got
        return got

    def clean_fit(self, profile: str) -> int:
        """Most instances of ``profile`` one empty GPU takes without stranding compute (Hopper 3g: 1, 2g: 3)."""
        got = self._clean.get(profile)
        if got is None:
            got = self._clean_count(EMPTY, profile, 0)
            self._clean[profile] = got
        return got

    def _clean_count(self, state: int, profile: str, placed: int) -> int:
        best = placed if self.stranded(state) == 0 else 0
        for s in self.starts(state, profile):
            best = max(best, self._clean_count(self.add(state, profile, s), profile, placed + 1))
        return best

    def placements(self, state: int) -> int:
        """Number of free (profile, start) placements: how many ways the GPU can still be carved."""
        got = self._placements.get(state)
        if got is None:
            got = sum(len(self.starts(state, p.name)) for p in self.geometry.profiles)
            self._placements[state] = got
        return got

    def largest_free(self, state: int) -> MigShape | None:
        """The largest profile (by compute, then memory) with a free placement: the GPU's largest free block."""
        if state in self._largest:
            return self._largest[state]
        best: MigShape | None = None
        for p in self.geometry.profiles:
            if self.can_host(state, p.name) and (best is None or (p.compute, p.memory) > (best.compute, best.memory)):
                best = p
        self._largest[state] = best
        return best


_SLOTS: dict[str, Slots] = {}


def slots_for(geometry: MigGeometry) -> Slots:
    """A shared memoising :class:`Slots` per geometry name (pure: the tables depend only on it)."""
    got = _SLOTS.get(geometry.name)
    if got is None or got.geometry != geometry:
        got = Slots(geometry)
        _SLOTS[geometry.name] = got
    return got
