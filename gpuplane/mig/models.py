"""The MIG profile table of every GPU model: names, memory, SMs and engines per row; pure data.

Each model's rows are the seven shapes of :data:`gpuplane.mig.geometry.HOPPER` (slices,
placements, counts) with that model's own columns: the profile name ``nvidia-smi`` shows
("3g.40gb"), the memory, the SMs and the engines. The real backend reads the same facts from
NVML at run time (as :class:`MigProfile` values too); these tables are for the simulator, for a
MIG-capable GPU whose MIG mode is off (NVML then reports no profiles), and for tests.

Sources:
- Profile names, instance counts and placements: the NVIDIA Multi-Instance GPU User Guide
  (docs.nvidia.com/datacenter/tesla/mig-user-guide, "Supported MIG Profiles") and
  ``nvidia-smi mig -lgip/-lgipp`` transcripts (A100-80GB, H100-80GB, H100 NVL 94GB, GH200).
- SM, copy-engine, NVDEC, JPEG and OFA counts: the same transcripts for A100 and Hopper.
- Values marked ``# unverified`` are assumptions (no primary source found): H200 memory sizes,
  every Blackwell SM/engine count and the B200/GB200 memory sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuplane.mig import geometry

_MIB = 1024 * 1024


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a GPU model (a row of its MIG table, as NVML reports it).

    ``profile_id`` is the NVML GPU-instance profile *constant*
    (NVML_GPU_INSTANCE_PROFILE_1_SLICE == 0, ...); ``info_id`` is the id NVML
    returns in the profile info and expects in placement/create calls.
    ``placements`` are the valid start memory-slice slots; every placement
    occupies ``memory_slices`` consecutive slots from its start.
    """

    name: str  # e.g. "3g.40gb", "1g.10gb+me"
    profile_id: int
    info_id: int
    compute_slices: int
    memory_slices: int
    memory_bytes: int
    multiprocessors: int
    max_count: int
    placements: tuple[int, ...]
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0


@dataclass(frozen=True)
class MigModel:
    """The MIG table of one GPU model."""

    key: str  # "A100-40GB", "H100-80GB", ...
    profiles: tuple[MigProfile, ...]
    layout: geometry.MigGeometry = geometry.HOPPER

    @property
    def memory_slices(self) -> int:
        return self.layout.memory_slices

    @property
    def compute_slices(self) -> int:
        return self.layout.compute_slices

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


def _model(
    key: str,
    names: Sequence[str],
    memory_mib: Sequence[int],
    sms: Sequence[int],
    engines: Sequence[_Engines],
) -> MigModel:
    """Build a model from per-row columns given in the order of ``geometry.HOPPER``'s rows."""
    rows: list[MigProfile] = []
    for shape, name, mem, sm, eng in zip(geometry.HOPPER.profiles, names, memory_mib, sms, engines, strict=True):
        rows.append(
            MigProfile(
                name=name,
                profile_id=shape.profile_id,
                info_id=shape.profile_id,  # NVML's profile info id equals the constant on all shipped drivers
                compute_slices=shape.compute,
                memory_slices=shape.memory,
                memory_bytes=mem * _MIB,
                multiprocessors=sm,
                max_count=shape.max_count,
                placements=shape.starts,
                copy_engines=eng.ce,
                decoders=eng.dec,
                encoders=eng.enc,
                jpegs=eng.jpg,
                ofas=eng.ofa,
            )
        )
    return MigModel(key=key, profiles=tuple(rows), layout=geometry.HOPPER)


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
