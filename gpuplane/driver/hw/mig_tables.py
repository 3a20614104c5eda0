"""MIG geometry per GPU model, as pure data, plus the rules that decide which GPU instances may coexist.

This module knows nothing about devices or state: it holds the profile table of each MIG-capable GPU
model (what ``nvidia-smi mig -lgip`` / ``-lgipp`` print) and the pure functions the simulator uses to
accept or refuse a GPU-instance creation the way NVML does. The real backend reads the same facts from
NVML at run time; these tables are for the simulator and for tests.

Sources:
- Profile names, instance counts and placements: the NVIDIA Multi-Instance GPU User Guide
  (docs.nvidia.com/datacenter/tesla/mig-user-guide, "Supported MIG Profiles") and
  ``nvidia-smi mig -lgip/-lgipp`` transcripts (A100-80GB, H100-80GB, H100 NVL 94GB, GH200).
- SM, copy-engine, NVDEC, JPEG and OFA counts: the same transcripts for A100 and Hopper.
- Values marked ``# unverified`` are assumptions (no primary source found): H200 memory sizes,
  every Blackwell SM/engine count and the B200/GB200 memory sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuplane.driver.hw.interface import ErrorCode, MigProfile

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

_MIB = 1024 * 1024


@dataclass(frozen=True)
class MigModel:
    """The MIG table of one GPU model."""

    key: str  # "A100-40GB", "H100-80GB", ...
    profiles: tuple[MigProfile, ...]
    memory_slices: int = MEMORY_SLICES
    compute_slices: int = COMPUTE_SLICES

    def profile(self, profile_id: int) -> MigProfile | None:
        """The profile for an NVML GI profile constant, or None when this model lacks it."""
        for p in self.profiles:
            if p.profile_id == profile_id:
                return p
        return None

    def profile_by_name(self, name: str) -> MigProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True)
class _Engines:
    ce: int
    dec: int
    enc: int
    jpg: int
    ofa: int


# Row geometry shared by every 8-memory-slice / 7-compute-slice GPU:
# (constant, compute slices, memory slices, max count, valid start slots)
_GEOMETRY: dict[int, tuple[int, int, int, tuple[int, ...]]] = {
    GI_PROFILE_1_SLICE: (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    GI_PROFILE_1_SLICE_REV1: (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    GI_PROFILE_1_SLICE_REV2: (1, 2, 4, (0, 2, 4, 6)),
    GI_PROFILE_2_SLICE: (2, 2, 3, (0, 2, 4)),
    GI_PROFILE_3_SLICE: (3, 4, 2, (0, 4)),
    GI_PROFILE_4_SLICE: (4, 4, 1, (0,)),
    GI_PROFILE_7_SLICE: (7, 8, 1, (0,)),
}

# Row order used for every model (the order nvidia-smi lists them).
_ROW_ORDER = (
    GI_PROFILE_1_SLICE,
    GI_PROFILE_1_SLICE_REV1,
    GI_PROFILE_1_SLICE_REV2,
    GI_PROFILE_2_SLICE,
    GI_PROFILE_3_SLICE,
    GI_PROFILE_4_SLICE,
    GI_PROFILE_7_SLICE,
)


def _model(
    key: str,
    names: Sequence[str],
    memory_mib: Sequence[int],
    sms: Sequence[int],
    engines: Sequence[_Engines],
) -> MigModel:
    """Build a model from per-row columns given in ``_ROW_ORDER``."""
    rows: list[MigProfile] = []
    for const, name, mem, sm, eng in zip(_ROW_ORDER, names, memory_mib, sms, engines, strict=True):
        compute, mem_slices, max_count, placements = _GEOMETRY[const]
        rows.append(
            MigProfile(
                name=name,
                profile_id=const,
                info_id=const,  # NVML's profile info id equals the constant on all shipped drivers
                compute_slices=compute,
                memory_slices=mem_slices,
                memory_bytes=mem * _MIB,
                multiprocessors=sm,
                max_count=max_count,
                placements=placements,
                copy_engines=eng.ce,
                decoders=eng.dec,
                encoders=eng.enc,
                jpegs=eng.jpg,
                ofas=eng.ofa,
            )
        )
    return MigModel(key=key, profiles=tuple(rows))


# Engines per row (1g, 1g+me, 1g double memory, 2g, 3g, 4g, 7g).
# A100: nvidia-smi -lgip on A100-SXM4-80GB + MIG user guide A100 table.
_AMPERE_ENGINES = (
    _Engines(1, 0, 0, 0, 0),
    _Engines(1, 1, 0, 1, 1),
    _Engines(1, 1, 0, 0, 0),
    _Engines(2, 1, 0, 0, 0),
    _Engines(3, 2, 0, 0, 0),
    _Engines(4, 2, 0, 0, 0),
    _Engines(7, 5, 0, 1, 1),
)
_AMPERE_SMS = (14, 14, 14, 28, 42, 56, 98)

# Hopper: nvidia-smi -lgip on H100 80GB HBM3, H100 NVL and GH200 (identical columns).
_HOPPER_ENGINES = (
    _Engines(1, 1, 0, 1, 0),
    _Engines(1, 1, 0, 1, 1),
    _Engines(1, 1, 0, 1, 0),
    _Engines(2, 2, 0, 2, 0),
    _Engines(3, 3, 0, 3, 0),
    _Engines(4, 4, 0, 4, 0),
    _Engines(8, 7, 0, 7, 1),
)
_HOPPER_SXM_SMS = (16, 16, 26, 32, 60, 64, 132)

# Blackwell: no primary transcript found; Hopper's engine layout is assumed.  # unverified
_BLACKWELL_ENGINES = _HOPPER_ENGINES  # unverified
_BLACKWELL_SMS = (18, 18, 18, 36, 54, 72, 126)  # unverified (18 SMs per compute slice assumed)


A100_40GB = _model(
    "A100-40GB",
    ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    (4864, 4864, 9856, 9856, 19968, 19968, 40192),
    _AMPERE_SMS,
    _AMPERE_ENGINES,
)
A100_80GB = _model(
    "A100-80GB",
    ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (9984, 9984, 19968, 19968, 40192, 40192, 80896),
    _AMPERE_SMS,
    _AMPERE_ENGINES,
)
H100_80GB = _model(
    "H100-80GB",
    ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (9984, 9984, 20096, 20096, 40448, 40448, 81152),
    _HOPPER_SXM_SMS,
    _HOPPER_ENGINES,
)
# H100 NVL (94GB): names, sizes and SMs from an nvidia-smi transcript on "NVIDIA H100 NVL".
H100_94GB = _model(
    "H100-94GB",
    ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    (11008, 11008, 22144, 22144, 47488, 47488, 95360),
    _HOPPER_SXM_SMS,
    _HOPPER_ENGINES,
)
# H200: names from the MIG user guide / mig-parted; memory sizes scaled from H100.  # unverified
H200_141GB = _model(
    "H200-141GB",
    ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    (17664, 17664, 35456, 35456, 71296, 71296, 143104),  # unverified
    _HOPPER_SXM_SMS,
    _HOPPER_ENGINES,
)
B200_180GB = _model(
    "B200-180GB",
    ("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
    (23040, 23040, 46080, 46080, 92160, 92160, 184320),  # unverified
    _BLACKWELL_SMS,
    _BLACKWELL_ENGINES,
)
# GB200 (186GB): names from mig-parted / cloud MIG catalogs; geometry as B200.
GB200_186GB = _model(
    "GB200-186GB",
    ("1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
    # unverified; chosen so that every valid layout fits the GPU's 189471 MiB (two 3g, four 1g double, ...)
    (23552, 23552, 47104, 47104, 94208, 94208, 188416),
    _BLACKWELL_SMS,
    _BLACKWELL_ENGINES,
)

ALL_MODELS: tuple[MigModel, ...] = (
    A100_40GB,
    A100_80GB,
    H100_80GB,
    H100_94GB,
    H200_141GB,
    B200_180GB,
    GB200_186GB,
)


def model_for_product(product_name: str) -> MigModel | None:
    """The MIG table for an NVML product name ("NVIDIA H100 80GB HBM3"), or None when not MIG-capable here."""
    name = product_name.upper()
    if "A100" in name:
        return A100_80GB if "80GB" in name else A100_40GB
    if "GB200" in name:
        return GB200_186GB
    if "B200" in name:
        return B200_180GB
    if "H200" in name:
        return H200_141GB
    if "H100" in name:
        # "NVIDIA H100 NVL" and the 94GB SXM/PCIe boards share the 94GB table.
        if "NVL" in name or "94GB" in name:
            return H100_94GB
        return H100_80GB
    return None


def model_by_key(key: str) -> MigModel | None:
    for m in ALL_MODELS:
        if m.key == key:
            return m
    return None


# --- placement rules ------------------------------------------------------------


def memory_slots(start: int, size: int) -> range:
    """The memory-slice slots a placement occupies."""
    return range(start, start + size)


def placements_conflict(a_start: int, a_size: int, b_start: int, b_size: int) -> bool:
    """Two placements conflict iff their memory-slice ranges overlap."""
    return a_start < b_start + b_size and b_start < a_start + a_size


@dataclass(frozen=True)
class Refusal:
    """Why a GI creation would be refused, with the NVML code it maps to."""

    code: ErrorCode
    reason: str


def check_create(
    model: MigModel,
    existing: Iterable[tuple[int, int]],
    profile_id: int,
    placement_start: int,
) -> Refusal | None:
    """Decide whether a GI of ``profile_id`` at ``placement_start`` can join ``existing``.

    ``existing`` holds ``(profile_id, placement_start)`` of the GIs already on the GPU. Returns None
    when the creation is allowed, else the refusal NVML would give:
    NOT_SUPPORTED for a profile the model lacks, INVALID_ARGUMENT for a start slot not in the
    profile's placement list, INSUFFICIENT_RESOURCES for a taken/overlapping placement, an exceeded
    per-profile count or exhausted compute slices.
    """
    if not 0 <= profile_id < GI_PROFILE_COUNT:
        return Refusal(ErrorCode.INVALID_ARGUMENT, f"profile constant {profile_id} out of range")
    prof = model.profile(profile_id)
    if prof is None:
        return Refusal(ErrorCode.NOT_SUPPORTED, f"profile {profile_id} not supported on {model.key}")
    if placement_start not in prof.placements:
        return Refusal(
            ErrorCode.INVALID_ARGUMENT,
            f"placement {placement_start} not valid for {prof.name} (valid: {list(prof.placements)})",
        )
    same = 0
    compute_used = 0
    for other_pid, other_start in existing:
        other = model.profile(other_pid)
        if other is None:  # cannot happen for state this module accepted
            continue
        compute_used += other.compute_slices
        if other_pid == profile_id:
            same += 1
        if placements_conflict(placement_start, prof.memory_slices, other_start, other.memory_slices):
            return Refusal(
                ErrorCode.INSUFFICIENT_RESOURCES,
                f"{prof.name}@{placement_start} overlaps {other.name}@{other_start}",
            )
    if same >= prof.max_count:
        return Refusal(ErrorCode.INSUFFICIENT_RESOURCES, f"{prof.name}: at most {prof.max_count} instances")
    if compute_used + prof.compute_slices > model.compute_slices:
        return Refusal(
            ErrorCode.INSUFFICIENT_RESOURCES,
            f"compute slices exhausted ({compute_used}+{prof.compute_slices} > {model.compute_slices})",
        )
    return None


def layout_is_valid(model: MigModel, instances: Sequence[tuple[int, int]]) -> bool:
    """True when every ``(profile_id, start)`` could have been created in this order (order-free rules)."""
    return all(check_create(model, instances[:i], pid, s) is None for i, (pid, s) in enumerate(instances))


def used_slots(model: MigModel, instances: Iterable[tuple[int, int]]) -> set[int]:
    """Memory slots occupied by ``(profile_id, start)`` instances."""
    slots: set[int] = set()
    for pid, start in instances:
        prof = model.profile(pid)
        if prof is not None:
            slots.update(memory_slots(start, prof.memory_slices))
    return slots


def caps_minors(gpu_minor: int, gi_id: int, ci_id: int | None) -> tuple[int, int | None]:
    """/dev/nvidia-caps minors of a GI's and CI's access files, per the driver's mig-minors numbering.

    The driver numbers ``config``=1, ``monitor``=2, then for each GPU 15 GIs x (1 GI + 8 CI) entries.
    (Layout of /proc/driver/nvidia-caps/mig-minors; read that file on real hardware.)
    """
    gi_minor = 3 + gpu_minor * 15 * 9 + gi_id * 9
    return gi_minor, (None if ci_id is None else gi_minor + 1 + ci_id)
