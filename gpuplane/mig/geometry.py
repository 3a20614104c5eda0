"""The MIG slice layout and the coexistence rule: which slices a GPU instance takes.

Every MIG-capable GPU model here (A100, H100, H200, B200, GB200) has 8 memory slices and 7
compute slices, and the same seven GPU-instance rows (the MIG User Guide's "Supported MIG
Profiles" tables, ``nvidia-smi mig -lgipp``). A row is a :class:`MigShape`: its NVML profile
constant, its compute and memory slices, the start slots NVML accepts and how many instances of
it one GPU holds. Names here are the model-free ones the placement module uses ("3g", "1g.2m");
each model's own names ("3g.40gb") are in :mod:`gpuplane.mig.models`.

The rule (one, for the driver's create check and the placement slot arithmetic): an instance of a
shape at ``start`` takes memory slices ``start .. start+memory-1`` and compute slices ``start ..
start+compute-1`` (:func:`footprint`); instances coexist when their footprints are disjoint and
no shape is used more often than its ``max_count``. Only the media-extension row ("1g+me") has a
``max_count`` below its number of disjoint placements (:attr:`MigShape.exclusive`).
"""

from __future__ import annotations

from dataclasses import dataclass

# NVML GPU-instance profile constants (NVML_GPU_INSTANCE_PROFILE_*).
GI_PROFILE_1_SLICE = 0
GI_PROFILE_2_SLICE = 1
GI_PROFILE_3_SLICE = 2
GI_PROFILE_4_SLICE = 3
GI_PROFILE_7_SLICE = 4
GI_PROFILE_8_SLICE = 5
GI_PROFILE_6_SLICE = 6
GI_PROFILE_1_SLICE_REV1 = 7  # 1g with media extensions ("+me")
GI_PROFILE_2_SLICE_REV1 = 8
GI_PROFILE_1_SLICE_REV2 = 9  # 1g with double memory
GI_PROFILE_COUNT = 10

# NVML compute-instance profile constants (NVML_COMPUTE_INSTANCE_PROFILE_*), keyed by slice count.
CI_PROFILE_BY_SLICES: dict[int, int] = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True)
class MigShape:
    """One GPU-instance row of the slice layout, the same on every model that has it.

    ``starts`` are the valid start slots, in memory-slice units (NVML's ``placement.start``);
    ``max_count`` is how many instances of the row one GPU holds (NVML's ``instanceCount``).
    """

    name: str  # model-free: "1g", "1g+me", "1g.2m", "2g", "3g", "4g", "7g"
    profile_id: int  # NVML GI profile constant
    compute: int
    memory: int
    starts: tuple[int, ...]
    max_count: int

    @property
    def exclusive(self) -> bool:
        """Allowed once per GPU although it has several disjoint placements (the ``+me`` row owns the media engines)."""
        return self.max_count == 1 and len(self.starts) > 1


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The slice layout of a GPU family: slice counts and its rows."""

    name: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigShape, ...]

    def profile(self, name: str) -> MigShape:
        """The row called ``name``; KeyError if this geometry has none."""
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(f"unknown MIG profile {name!r} for geometry {self.name}")

    def has_profile(self, name: str) -> bool:
        """Whether ``name`` is one of this geometry's rows."""
        return any(p.name == name for p in self.profiles)

    def shape(self, profile_id: int) -> MigShape | None:
        """The row of an NVML GI profile constant, or None when the layout lacks it."""
        for p in self.profiles:
            if p.profile_id == profile_id:
                return p
        return None


HOPPER = MigGeometry(
    name="hopper-7c8m",
    compute_slices=COMPUTE_SLICES,
    memory_slices=MEMORY_SLICES,
    profiles=(  # in the order nvidia-smi lists them
        MigShape("1g", GI_PROFILE_1_SLICE, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        MigShape("1g+me", GI_PROFILE_1_SLICE_REV1, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        MigShape("1g.2m", GI_PROFILE_1_SLICE_REV2, 1, 2, (0, 2, 4, 6), 4),
        MigShape("2g", GI_PROFILE_2_SLICE, 2, 2, (0, 2, 4), 3),
        MigShape("3g", GI_PROFILE_3_SLICE, 3, 4, (0, 4), 2),
        MigShape("4g", GI_PROFILE_4_SLICE, 4, 4, (0,), 1),
        MigShape("7g", GI_PROFILE_7_SLICE, 7, 8, (0,), 1),
    ),
)
"""The 7-compute / 8-memory-slice layout; A100, H100, H200 and Blackwell share it (named for Hopper)."""


def footprint(geometry: MigGeometry, compute: int, memory: int, start: int) -> int:
    """The slices an instance of ``compute``/``memory`` slices at ``start`` takes, as bits.

    Memory slice i is bit i; compute slice j is bit ``geometry.memory_slices + j``. ValueError
    when the instance would reach past the GPU's slices.
    """
    if start < 0 or start + memory > geometry.memory_slices or start + compute > geometry.compute_slices:
        raise ValueError(f"{compute}g/{memory}m at {start} exceeds geometry {geometry.name}")
    mem = ((1 << memory) - 1) << start
    cmp = ((1 << compute) - 1) << start
    return mem | (cmp << geometry.memory_slices)
