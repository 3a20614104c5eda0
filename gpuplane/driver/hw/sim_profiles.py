"""Named node profiles for the simulator: which GPUs a node has and how they are wired.

Pure data. Each profile lists its GPUs by minor number (static facts NVML would report), the NVLink
peer groups, and whether the GPUs report multi-node fabric (GB200 NVL72). Identity that depends on the
node (UUIDs) and on configuration (driver version, fabric cluster) is added by :mod:`gpuplane.driver.hw.sim`.
Numbers marked ``# unverified`` are plausible values without a primary source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpuplane.mig import models

_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuSpec:
    """Static facts of one simulated GPU model."""

    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_bytes: int
    multiprocessors: int
    mig_model: models.MigModel | None
    mig_toggle_needs_reset: bool = False
    idle_power_w: float = 70.0


@dataclass(frozen=True)
class NodeProfile:
    name: str
    gpu: GpuSpec
    # PCI bus numbers of the GPUs, one per minor (minor i has bus_numbers[i]).
    bus_numbers: tuple[int, ...]
    # Sets of minors that are NVLink peers of each other (every pair within a set is P2P over NVLink).
    nvlink_groups: tuple[frozenset[int], ...]
    reports_fabric: bool = False

    @property
    def gpu_count(self) -> int:
        return len(self.bus_numbers)

    def pci_bus_id(self, minor: int) -> str:
        return f"0000:{self.bus_numbers[minor]:02x}:00.0"

    def pcie_root(self, minor: int) -> str:
        # One root complex per GPU, named after the bus just above it (typical of HGX boards).
        return f"pci0000:{self.bus_numbers[minor] - 1:02x}"

    def nvlink_peers(self, minor_a: int, minor_b: int) -> bool:
        if minor_a == minor_b:
            return False
        return any(minor_a in g and minor_b in g for g in self.nvlink_groups)


_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_ALL8 = (frozenset(range(8)),)

H100_SXM = GpuSpec(
    product_name="NVIDIA H100 80GB HBM3",
    brand="nvidia",
    architecture="hopper",
    cuda_compute_capability="9.0",
    memory_bytes=81559 * _MIB,
    multiprocessors=132,
    mig_model=models.H100_80GB,
)
H200_SXM = GpuSpec(
    product_name="NVIDIA H200",
    brand="nvidia",
    architecture="hopper",
    cuda_compute_capability="9.0",
    memory_bytes=143771 * _MIB,
    multiprocessors=132,
    mig_model=models.H200_141GB,
)
H100_NVL = GpuSpec(
    product_name="NVIDIA H100 NVL",
    brand="nvidia",
    architecture="hopper",
    cuda_compute_capability="9.0",
    memory_bytes=95830 * _MIB,
    multiprocessors=132,
    mig_model=models.H100_94GB,
    idle_power_w=60.0,
)
GB200 = GpuSpec(
    product_name="NVIDIA GB200",
    brand="nvidia",
    architecture="blackwell",
    cuda_compute_capability="10.0",
    memory_bytes=189471 * _MIB,  # unverified
    multiprocessors=152,  # unverified
    mig_model=models.GB200_186GB,
    idle_power_w=150.0,  # unverified
)
A100_SXM_40 = GpuSpec(
    product_name="NVIDIA A100-SXM4-40GB",
    brand="nvidia",
    architecture="ampere",
    cuda_compute_capability="8.0",
    memory_bytes=40960 * _MIB,
    multiprocessors=108,
    mig_model=models.A100_40GB,
    mig_toggle_needs_reset=True,
    idle_power_w=55.0,
)
L4 = GpuSpec(
    product_name="NVIDIA L4",
    brand="nvidia",
    architecture="ada",
    cuda_compute_capability="8.9",
    memory_bytes=23034 * _MIB,
    multiprocessors=58,
    mig_model=None,
    idle_power_w=16.0,
)

PROFILES: Mapping[str, NodeProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            NodeProfile("hgx-h100", H100_SXM, _HGX_BUSES, _ALL8),
            NodeProfile("hgx-h200", H200_SXM, _HGX_BUSES, _ALL8),
            NodeProfile(
                "h100-nvl-pcie",
                H100_NVL,
                (0x17, 0x31, 0xB1, 0xCA),
                (frozenset({0, 1}), frozenset({2, 3})),
            ),
            NodeProfile(
                "gb200-nvl72",
                GB200,
                (0x01, 0x02, 0x03, 0x04),  # unverified bus numbering
                (frozenset(range(4)),),
                reports_fabric=True,
            ),
            NodeProfile("a100-40gb", A100_SXM_40, (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD), _ALL8),
            NodeProfile("pcie-l4", L4, (0x17, 0x31, 0xB1, 0xCA), ()),
        )
    }
)

PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)


def node_profile(name: str) -> NodeProfile:
    """The node profile called ``name``; ValueError names the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown simulator profile {name!r}; known: {', '.join(PROFILE_NAMES)}") from None
