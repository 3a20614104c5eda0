"""The real :class:`~gpuplane.driver.hw.interface.GpuBackend`, on NVIDIA's NVML through nvidia-ml-py (``pynvml``).

This module and its parts are the only ones that touch ``pynvml``. They are importable and
type-checkable without a GPU or the library: the module is loaded in :meth:`NvmlBackend.__init__`,
and tests pass a fake module in.

Rules it follows (NVML API reference, docs.nvidia.com/deploy/nvml-api, and nvidia-ml-py behaviour):
- every call is serialized by one lock, and ``pynvml.NVMLError`` becomes :class:`HardwareError`
  with the matching :class:`ErrorCode` (:mod:`~gpuplane.driver.hw.nvml_session`);
- ``init``/``shutdown`` map to ``nvmlInit``/``nvmlShutdown``; the backend is a context manager;
- GI placement and creation take the profile *info id*, not the profile constant
  (:mod:`~gpuplane.driver.hw.nvml_mig`); health events and samples: :mod:`~gpuplane.driver.hw.nvml_health`;
- PCI bus ids are normalized from NVML's ``00000000:18:00.0`` to ``0000:18:00.0``.

This module: lifecycle, inventory (GPUs, NVLink, fabric, processes) and time-slicing (through
``nvidia-smi compute-policy``, which changes the GPU's scheduling).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import uuid as uuidlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType, TracebackType

from gpuplane.driver.hw.interface import (
    ErrorCode,
    FabricInfo,
    GpuInfo,
    HardwareError,
    Process,
)
from gpuplane.driver.hw.nvml_health import NvmlHealth
from gpuplane.driver.hw.nvml_mig import NvmlMig
from gpuplane.driver.hw.nvml_session import cuda_version_text, normalize_pci_bus_id, text

TIMESLICE_VALUES = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


class NvmlBackend(NvmlMig, NvmlHealth):
    """GpuBackend on NVML. Construct, then ``init()`` (or use ``with``); ``shutdown()`` in ``finally``."""

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        *,
        nvidia_smi: str = "nvidia-smi",
        run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
        mig_minors_path: Path = Path("/proc/driver/nvidia-caps/mig-minors"),
        sysfs_pci_root: Path = Path("/sys/bus/pci/devices"),
        event_slice_s: float = 0.1,
    ) -> None:
        super().__init__(nvml if nvml is not None else importlib.import_module("pynvml"))
        self._nvidia_smi = nvidia_smi
        self._run = run or self._run_command
        self._mig_minors_path = mig_minors_path
        self._sysfs_pci_root = sysfs_pci_root
        self._event_slice_s = event_slice_s
        self._event_set = None

    @staticmethod
    def _run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

    # --- lifecycle ----------------------------------------------------------------------

    def init(self) -> None:
        with self._guard():
            self._nvml.nvmlInit()

    def shutdown(self) -> None:
        with self._guard():
            try:
                if self._event_set is not None:
                    self._try(self._nvml.nvmlEventSetFree, self._event_set)
                    self._event_set = None
            finally:
                self._nvml.nvmlShutdown()

    def __enter__(self) -> NvmlBackend:
        self.init()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    # --- device nodes ----------------------------------------------------------------------

    def device_node_dir(self) -> Path | None:
        """The kernel driver's own nodes in /dev (made by nvidia-modprobe): the configured dev root applies."""
        return None

    # --- inventory -------------------------------------------------------------------------

    def _named_constant(self, prefix: str, value: int) -> str:
        for attr in dir(self._nvml):
            if attr.startswith(prefix) and getattr(self._nvml, attr) == value:
                return attr[len(prefix) :].lower()
        return "unknown"

    def _pcie_root(self, bus_id: str) -> str:
        try:
            real = os.path.realpath(self._sysfs_pci_root / bus_id)
        except OSError:
            return ""
        for part in Path(real).parts:
            if part.startswith("pci"):
                return part
        return ""

    def gpus(self) -> Sequence[GpuInfo]:
        n = self._nvml
        with self._guard():
            driver = text(n.nvmlSystemGetDriverVersion())
            cuda = cuda_version_text(int(n.nvmlSystemGetCudaDriverVersion()))
            out: list[GpuInfo] = []
            for index in range(int(n.nvmlDeviceGetCount())):
                h = n.nvmlDeviceGetHandleByIndex(index)
                bus = normalize_pci_bus_id(n.nvmlDeviceGetPciInfo(h).busId)
                arch = self._named_constant("NVML_DEVICE_ARCH_", int(n.nvmlDeviceGetArchitecture(h)))
                cc_major, cc_minor = n.nvmlDeviceGetCudaComputeCapability(h)
                mig_mode = self._try(n.nvmlDeviceGetMigMode, h)
                attrs = self._try(n.nvmlDeviceGetAttributes, h)
                out.append(
                    GpuInfo(
                        index=index,
                        minor=int(n.nvmlDeviceGetMinorNumber(h)),
                        uuid=text(n.nvmlDeviceGetUUID(h)),
                        pci_bus_id=bus,
                        product_name=text(n.nvmlDeviceGetName(h)),
                        brand=self._named_constant("NVML_BRAND_", int(n.nvmlDeviceGetBrand(h))),
                        architecture=arch,
                        cuda_compute_capability=f"{cc_major}.{cc_minor}",
                        driver_version=driver,
                        cuda_driver_version=cuda,
                        memory_bytes=int(n.nvmlDeviceGetMemoryInfo(h).total),
                        multiprocessors=int(attrs.multiprocessorCount) if attrs is not None else 0,
                        mig_capable=mig_mode is not None,
                        # Ampere (A100/A30) applies a MIG toggle only after a GPU reset.
                        mig_toggle_needs_reset=mig_mode is not None and arch == "ampere",
                        pcie_root=self._pcie_root(bus),
                    )
                )
            return tuple(out)

    def nvlink_p2p(self, uuid_a: str, uuid_b: str) -> bool:
        n = self._nvml
        with self._guard():
            ha, hb = self._handle(uuid_a), self._handle(uuid_b)
            if uuid_a == uuid_b:
                return False
            try:
                status = n.nvmlDeviceGetP2PStatus(ha, hb, n.NVML_P2P_CAPS_INDEX_NVLINK)
                return bool(status == n.NVML_P2P_STATUS_OK)
            except n.NVMLError:
                pass
            # Fallback: a direct link whose remote end is the other GPU.
            bus_b = normalize_pci_bus_id(n.nvmlDeviceGetPciInfo(hb).busId)
            for link in range(self._const("NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if n.nvmlDeviceGetNvLinkState(ha, link) != self._const("NVML_FEATURE_ENABLED", 1):
                        continue
                    remote = normalize_pci_bus_id(n.nvmlDeviceGetNvLinkRemotePciInfo(ha, link).busId)
                except (n.NVMLError, ValueError):  # link down, or a remote end that is not a PCI id
                    continue
                if remote == bus_b:
                    return True
            return False

    def fabric_info(self, uuid: str) -> FabricInfo:
        n = self._nvml
        unsupported = FabricInfo(cluster_uuid="", clique_id=0, state=FabricInfo.FABRIC_STATE_NOT_SUPPORTED)
        with self._guard():
            h = self._handle(uuid)
            fn = getattr(n, "nvmlDeviceGetGpuFabricInfoV", None)
            struct = getattr(n, "c_nvmlGpuFabricInfo_v2_t", None)
            if fn is None or struct is None:
                return unsupported
            info = struct()
            try:
                fn(h, ctypes.byref(info))
            except n.NVMLError as e:
                if self.translate(e).code is ErrorCode.GPU_IS_LOST:
                    raise
                return unsupported
            raw = bytes(info.clusterUuid)
            cluster = "" if not any(raw) else str(uuidlib.UUID(bytes=raw[:16]))
            return FabricInfo(
                cluster_uuid=cluster,
                clique_id=int(info.cliqueId),
                state=int(info.state),
                status_ok=int(info.status) == self._const("NVML_SUCCESS", 0),
            )

    def processes(self, uuid: str) -> Sequence[Process]:
        with self._guard():
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(uuid))
            return tuple(Process(pid=int(p.pid), used_memory_bytes=int(p.usedGpuMemory or 0)) for p in procs)

    # --- sharing ------------------------------------------------------------------------------

    def set_timeslice(self, uuid: str, interval: str) -> None:
        if interval not in TIMESLICE_VALUES:
            raise HardwareError(ErrorCode.INVALID_ARGUMENT, f"time-slice {interval!r} not in {list(TIMESLICE_VALUES)}")
        argv = [
            self._nvidia_smi,
            "compute-policy",
            "-i",
            uuid,
            f"--set-timeslice={TIMESLICE_VALUES[interval]}",
        ]
        with self._lock:
            try:
                res = self._run(argv)
            except (OSError, subprocess.SubprocessError) as e:
                raise HardwareError(ErrorCode.UNKNOWN, f"{' '.join(argv)}: {e}") from e
        if res.returncode != 0:
            out = f"{res.stdout}\n{res.stderr}".strip()
            low = out.lower()
            if "not supported" in low:
                code = ErrorCode.NOT_SUPPORTED
            elif "permission" in low:
                code = ErrorCode.NO_PERMISSION
            elif "not found" in low or "no devices" in low:
                code = ErrorCode.NOT_FOUND
            else:
                code = ErrorCode.UNKNOWN
            raise HardwareError(code, f"{' '.join(argv)} exited {res.returncode}: {out}")
