"""The hardware boundary: everything the driver asks of the GPU layer.

Two implementations exist: :mod:`gpuplane.driver.hw.nvml` (the real one, on nvidia-ml-py)
and :mod:`gpuplane.driver.hw.sim` (a simulator faithful to NVML, configured by named node
profiles). Everything above this module is the production code path; it only
sees the dataclasses and the :class:`GpuBackend` protocol defined here.

Design rules:
- The interface reports *facts* (what NVML would say); policy (naming, NVLink
  domains, which instances are orphaned) lives above it.
- Every failure is a :class:`HardwareError` carrying an :class:`ErrorCode` that
  mirrors NVML's return codes, so callers can react the same way to both
  implementations.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuplane.mig.models import MigProfile


class ErrorCode(enum.Enum):
    """NVML return codes the driver distinguishes (names follow NVML_ERROR_*)."""

    NOT_SUPPORTED = "NotSupported"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    NO_PERMISSION = "NoPermission"
    INVALID_ARGUMENT = "InvalidArgument"
    IN_USE = "InUse"
    NOT_FOUND = "NotFound"
    GPU_IS_LOST = "GpuIsLost"
    RESET_REQUIRED = "ResetRequired"
    UNINITIALIZED = "Uninitialized"
    UNKNOWN = "Unknown"


class HardwareError(Exception):
    """A failed hardware call. ``code`` mirrors the NVML return code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ComputeInstance:
    ci_id: int
    profile_id: int


@dataclass(frozen=True)
class GpuInstance:
    """A MIG GPU instance that exists on the device."""

    gi_id: int
    profile_id: int  # NVML GI profile constant
    placement_start: int
    placement_size: int
    compute_instances: tuple[ComputeInstance, ...] = ()
    # UUID of the MIG device ("MIG-...") once a compute instance exists.
    mig_uuid: str | None = None
    # /dev/nvidia-caps minor numbers for the GI/CI access files, if known.
    gi_caps_minor: int | None = None
    ci_caps_minor: int | None = None


@dataclass(frozen=True)
class MigMode:
    current: bool
    pending: bool


@dataclass(frozen=True)
class FabricInfo:
    """GPU fabric (multi-node NVLink) state, from nvmlDeviceGetGpuFabricInfoV."""

    cluster_uuid: str  # canonical 8-4-4-4-12 text; "" when not supported
    clique_id: int
    state: int  # 0 NOT_SUPPORTED, 1 NOT_STARTED, 2 IN_PROGRESS, 3 COMPLETED
    status_ok: bool = True

    FABRIC_STATE_NOT_SUPPORTED = 0
    FABRIC_STATE_COMPLETED = 3

    @property
    def completed(self) -> bool:
        return self.state == self.FABRIC_STATE_COMPLETED and self.status_ok and bool(self.cluster_uuid)


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one physical GPU."""

    index: int  # NVML index: NOT stable, never use it as a name
    minor: int  # /dev/nvidia<minor>
    uuid: str  # "GPU-..."
    pci_bus_id: str  # "0000:18:00.0" (domain:bus:device.function, lower case)
    product_name: str  # "NVIDIA H100 80GB HBM3"
    brand: str  # "nvidia", "tesla", ...
    architecture: str  # "ampere", "hopper", "blackwell", "ada"
    cuda_compute_capability: str  # "9.0"
    driver_version: str  # "560.35.03"
    cuda_driver_version: str  # "12.6"
    memory_bytes: int
    multiprocessors: int
    mig_capable: bool
    # True where toggling MIG mode only takes effect after a GPU reset (A100).
    mig_toggle_needs_reset: bool = False
    pcie_root: str = ""  # e.g. "pci0000:00", "" when unknown


@dataclass(frozen=True)
class Process:
    pid: int
    used_memory_bytes: int


class HealthEventKind(enum.Enum):
    XID = "xid"
    ECC_DOUBLE_BIT = "ecc-dbe"
    ECC_SINGLE_BIT = "ecc-sbe"
    GPU_LOST = "gpu-lost"
    THERMAL = "thermal"
    POWER = "power"
    CLEARED = "cleared"  # simulator/real recovery signal: condition gone


@dataclass(frozen=True)
class HealthEvent:
    uuid: str  # physical GPU uuid
    kind: HealthEventKind
    xid: int = 0
    message: str = ""
    timestamp: float = 0.0


@dataclass(frozen=True)
class DeviceSample:
    """Telemetry sample for one physical GPU (DCGM-like units)."""

    uuid: str
    sm_active: float  # 0..1
    memory_used_bytes: int
    memory_bandwidth_util: float  # 0..1
    temperature_c: float
    power_w: float
    throttle_reasons: int  # NVML clocks-event-reasons bitmask
    ecc_sbe_total: int
    ecc_dbe_total: int
    # per-process memory-bandwidth share on MPS (pid -> 0..1); simulator only fills it
    per_process_bandwidth: dict[int, float] = field(default_factory=dict)


class GpuBackend(Protocol):
    """What the driver needs from the GPU layer. Implementations serialize calls.

    Conformance is checked statically: mypy --strict verifies every signature where
    :func:`gpuplane.driver.hw.select.make_backend` returns a ``Simulator`` or an ``NvmlBackend``
    as a ``GpuBackend`` (a runtime ``isinstance`` would compare method names only).
    """

    name: str

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    # --- inventory ---------------------------------------------------------
    def gpus(self) -> Sequence[GpuInfo]: ...

    def nvlink_p2p(self, uuid_a: str, uuid_b: str) -> bool:
        """True when the two GPUs of this node can talk peer-to-peer over NVLink."""
        ...

    def fabric_info(self, uuid: str) -> FabricInfo: ...

    def processes(self, uuid: str) -> Sequence[Process]: ...

    # --- MIG ---------------------------------------------------------------
    def mig_mode(self, uuid: str) -> MigMode: ...

    def set_mig_mode(self, uuid: str, enabled: bool) -> MigMode:
        """Request MIG mode; returns the resulting mode (pending != current means a reset is due)."""
        ...

    def mig_profiles(self, uuid: str) -> Sequence[MigProfile]:
        """The GI profiles this GPU supports (empty when not MIG-capable)."""
        ...

    def gpu_instances(self, uuid: str) -> Sequence[GpuInstance]: ...

    def create_gpu_instance(self, uuid: str, profile_id: int, placement_start: int) -> GpuInstance: ...

    def create_compute_instance(self, uuid: str, gi_id: int) -> GpuInstance:
        """Create the full-size compute instance in a GI; returns the GI with its MIG uuid."""
        ...

    def destroy_compute_instance(self, uuid: str, gi_id: int, ci_id: int) -> None: ...

    def destroy_gpu_instance(self, uuid: str, gi_id: int) -> None: ...

    # --- sharing -----------------------------------------------------------
    def set_timeslice(self, uuid: str, interval: str) -> None:
        """Apply a time-slice interval class: "Default", "Short", "Medium" or "Long"."""
        ...

    # --- device nodes -------------------------------------------------------
    def device_node_dir(self) -> Path | None:
        """The host directory holding this hardware's device nodes, or None for the standard ``/dev``.

        The nodes a CUDA container needs are ``nvidia<minor>``, ``nvidiactl``, ``nvidia-uvm``,
        ``nvidia-uvm-tools`` and, for MIG, ``nvidia-caps/nvidia-cap<N>``. A real NVIDIA driver makes
        them in ``/dev`` (None: the configured dev root); a backend whose nodes live elsewhere says
        where, and the CDI spec points the container's ``/dev/...`` at them.
        """
        ...

    # --- health and telemetry ---------------------------------------------
    def wait_health_events(self, timeout_s: float) -> Sequence[HealthEvent]: ...

    def sample(self, uuid: str) -> DeviceSample: ...
