"""The real :class:`~gpuplane.driver.hw.interface.GpuBackend`, on NVIDIA's NVML through nvidia-ml-py (``pynvml``).

This is the only module that touches ``pynvml``. It is importable and type-checkable without a GPU or
the library: the module is loaded in :meth:`NvmlBackend.__init__`, and tests pass a fake module in.

Rules it follows (NVML API reference, docs.nvidia.com/deploy/nvml-api, and nvidia-ml-py behaviour):
- every call is serialized by one lock (concurrent NVML calls on a handle can be very slow);
- ``init``/``shutdown`` map to ``nvmlInit``/``nvmlShutdown``; the backend is a context manager;
- ``pynvml.NVMLError`` becomes :class:`HardwareError` with the matching :class:`ErrorCode`;
- GI placement and creation take the profile *info id*, not the profile constant;
- PCI bus ids are normalized from NVML's ``00000000:18:00.0`` to ``0000:18:00.0``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import subprocess
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from gpuplane.driver.hw.interface import (
    ComputeInstance,
    DeviceSample,
    ErrorCode,
    FabricInfo,
    GpuInfo,
    GpuInstance,
    HardwareError,
    HealthEvent,
    HealthEventKind,
    MigMode,
    Process,
)
from gpuplane.mig import geometry, models
from gpuplane.mig.models import MigProfile

_MIB = 1024 * 1024

# NVML_ERROR_* names -> our codes (looked up by name so a fake module only needs the constants it uses).
_ERROR_NAMES: dict[str, ErrorCode] = {
    "NVML_ERROR_UNINITIALIZED": ErrorCode.UNINITIALIZED,
    "NVML_ERROR_INVALID_ARGUMENT": ErrorCode.INVALID_ARGUMENT,
    "NVML_ERROR_NOT_SUPPORTED": ErrorCode.NOT_SUPPORTED,
    "NVML_ERROR_NO_PERMISSION": ErrorCode.NO_PERMISSION,
    "NVML_ERROR_NOT_FOUND": ErrorCode.NOT_FOUND,
    "NVML_ERROR_GPU_NOT_FOUND": ErrorCode.NOT_FOUND,
    "NVML_ERROR_GPU_IS_LOST": ErrorCode.GPU_IS_LOST,
    "NVML_ERROR_RESET_REQUIRED": ErrorCode.RESET_REQUIRED,
    "NVML_ERROR_IN_USE": ErrorCode.IN_USE,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": ErrorCode.INSUFFICIENT_RESOURCES,
}

_MAX_PLACEMENTS = 32

TIMESLICE_VALUES = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

# Health events this backend subscribes to (nvmlEventType*).
_EVENT_SBE = 0x1
_EVENT_DBE = 0x2
_EVENT_XID = 0x8


def normalize_pci_bus_id(bus_id: str | bytes) -> str:
    """``00000000:18:00.0`` (NVML, 8-digit domain) -> ``0000:18:00.0`` (sysfs form, lower case)."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        domain = int(parts[0], 16)
        return f"{domain:04x}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:  # no domain given
        return f"0000:{parts[0]}:{parts[1]}"
    raise ValueError(f"not a PCI bus id: {bus_id!r}")


def cuda_version_text(version: int) -> str:
    """NVML's integer CUDA driver version (12080) -> "12.8"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_mig_minors(text: str) -> dict[tuple[int, int, int | None], int]:
    """Parse /proc/driver/nvidia-caps/mig-minors into {(gpu, gi, ci or None): minor}."""
    out: dict[tuple[int, int, int | None], int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 2 or not fields[0].startswith("gpu"):
            continue
        parts = fields[0].split("/")
        try:
            gpu = int(parts[0][3:])
            if len(parts) == 3 and parts[1].startswith("gi") and parts[2] == "access":
                out[(gpu, int(parts[1][2:]), None)] = int(fields[1])
            elif len(parts) == 4 and parts[2].startswith("ci") and parts[3] == "access":
                out[(gpu, int(parts[1][2:]), int(parts[2][2:]))] = int(fields[1])
        except ValueError:
            continue
    return out


class NvmlBackend:
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
        self._nvml: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        self._lock = threading.RLock()
        self._nvidia_smi = nvidia_smi
        self._run = run or self._run_command
        self._mig_minors_path = mig_minors_path
        self._sysfs_pci_root = sysfs_pci_root
        self._event_slice_s = event_slice_s
        self._event_set: Any = None
        self._code_by_value: dict[int, ErrorCode] = {
            getattr(self._nvml, n): c for n, c in _ERROR_NAMES.items() if hasattr(self._nvml, n)
        }

    # --- plumbing ---------------------------------------------------------------------

    @staticmethod
    def _run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

    def translate(self, err: BaseException) -> HardwareError:
        """An NVMLError as a HardwareError with the matching code (UNKNOWN for codes we don't distinguish)."""
        value = getattr(err, "value", None)
        code = self._code_by_value.get(value, ErrorCode.UNKNOWN) if isinstance(value, int) else ErrorCode.UNKNOWN
        return HardwareError(code, str(err) or f"NVML error {value}")

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Serialize and translate: the frame every public call runs in."""
        with self._lock:
            try:
                yield
            except self._nvml.NVMLError as e:
                raise self.translate(e) from e

    def _try(self, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """Call an optional NVML query; unsupported/absent -> ``default``; a lost GPU still raises."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            if self.translate(e).code is ErrorCode.GPU_IS_LOST:
                raise
            return default

    def _handle(self, uuid: str) -> Any:
        return self._nvml.nvmlDeviceGetHandleByUUID(uuid)

    def _const(self, name: str, default: int) -> int:
        return int(getattr(self._nvml, name, default))

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
            driver = _text(n.nvmlSystemGetDriverVersion())
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
                        uuid=_text(n.nvmlDeviceGetUUID(h)),
                        pci_bus_id=bus,
                        product_name=_text(n.nvmlDeviceGetName(h)),
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

    # --- MIG --------------------------------------------------------------------------------

    def mig_mode(self, uuid: str) -> MigMode:
        with self._guard():
            current, pending = self._nvml.nvmlDeviceGetMigMode(self._handle(uuid))
            enable = self._const("NVML_DEVICE_MIG_ENABLE", 1)
            return MigMode(current=current == enable, pending=pending == enable)

    def set_mig_mode(self, uuid: str, enabled: bool) -> MigMode:
        n = self._nvml
        with self._guard():
            mode = self._const("NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE", int(enabled))
            n.nvmlDeviceSetMigMode(self._handle(uuid), mode)
            return self.mig_mode(uuid)

    def _profile_infos(self, h: Any) -> list[tuple[int, Any]]:
        """(GI profile constant, profile info) for every profile the device reports."""
        n = self._nvml
        out: list[tuple[int, Any]] = []
        for const in range(self._const("NVML_GPU_INSTANCE_PROFILE_COUNT", geometry.GI_PROFILE_COUNT)):
            info = self._try(n.nvmlDeviceGetGpuInstanceProfileInfo, h, const)
            if info is not None and int(getattr(info, "instanceCount", 0)) > 0:
                out.append((const, info))
        return out

    def _placements(self, h: Any, info: Any) -> list[tuple[int, int]]:
        n = self._nvml
        # Sized for every possible start slot, not instanceCount: "1g+me" has 1 instance but 7 placements.
        arr = (n.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
        c_count = ctypes.c_uint(_MAX_PLACEMENTS)
        n.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(c_count))
        return [(int(arr[i].start), int(arr[i].size)) for i in range(c_count.value)]

    def mig_profiles(self, uuid: str) -> Sequence[MigProfile]:
        n = self._nvml
        with self._guard():
            h = self._handle(uuid)
            out: list[MigProfile] = []
            for const, info in self._profile_infos(h):
                places = self._placements(h, info)
                name = _text(getattr(info, "name", b"") or b"").removeprefix("MIG ").strip()
                out.append(
                    MigProfile(
                        name=name or f"profile-{const}",
                        profile_id=const,
                        info_id=int(info.id),
                        compute_slices=int(info.sliceCount),
                        memory_slices=places[0][1] if places else 0,
                        memory_bytes=int(info.memorySizeMB) * _MIB,
                        multiprocessors=int(info.multiprocessorCount),
                        max_count=int(info.instanceCount),
                        placements=tuple(start for start, _ in places),
                        copy_engines=int(info.copyEngineCount),
                        decoders=int(info.decoderCount),
                        encoders=int(info.encoderCount),
                        jpegs=int(info.jpegCount),
                        ofas=int(info.ofaCount),
                    )
                )
            if not out and self._try(n.nvmlDeviceGetMigMode, h) is not None:
                # MIG-capable but MIG is off: NVML reports no profiles; use the static table.
                model = models.model_for_product(_text(n.nvmlDeviceGetName(h)))
                return () if model is None else model.profiles
            return tuple(out)

    def _mig_uuids(self, h: Any) -> dict[int, str]:
        n = self._nvml
        out: dict[int, str] = {}
        for i in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
            mh = self._try(n.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            if mh is None:
                continue
            out[int(n.nvmlDeviceGetGpuInstanceId(mh))] = _text(n.nvmlDeviceGetUUID(mh))
        return out

    def _caps_minors(self) -> dict[tuple[int, int, int | None], int]:
        try:
            return parse_mig_minors(self._mig_minors_path.read_text())
        except OSError:
            return {}

    def _compute_instances(self, gi: Any) -> list[ComputeInstance]:
        n = self._nvml
        shared = self._const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        out: list[ComputeInstance] = []
        for ci_const in range(self._const("NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8)):
            info = self._try(n.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, ci_const, shared)
            if info is None:
                continue
            arr = (n.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            if self._try(n.nvmlGpuInstanceGetComputeInstances, gi, info.id, arr, ctypes.byref(count)) is None:
                continue
            for i in range(count.value):
                ci_info = n.nvmlComputeInstanceGetInfo(arr[i])
                out.append(ComputeInstance(ci_id=int(ci_info.id), profile_id=ci_const))
        return out

    def _gpu_instances(self, h: Any) -> list[GpuInstance]:
        n = self._nvml
        current, _ = n.nvmlDeviceGetMigMode(h)
        if current != self._const("NVML_DEVICE_MIG_ENABLE", 1):
            return []
        minor = int(n.nvmlDeviceGetMinorNumber(h))
        uuids = self._mig_uuids(h)
        caps = self._caps_minors()
        out: list[GpuInstance] = []
        for const, info in self._profile_infos(h):
            arr = (n.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            n.nvmlDeviceGetGpuInstances(h, info.id, arr, ctypes.byref(count))
            for i in range(count.value):
                gi = arr[i]
                ginfo = n.nvmlGpuInstanceGetInfo(gi)
                gi_id = int(ginfo.id)
                cis = tuple(self._compute_instances(gi))
                out.append(
                    GpuInstance(
                        gi_id=gi_id,
                        profile_id=const,
                        placement_start=int(ginfo.placement.start),
                        placement_size=int(ginfo.placement.size),
                        compute_instances=cis,
                        mig_uuid=uuids.get(gi_id),
                        gi_caps_minor=caps.get((minor, gi_id, None)),
                        ci_caps_minor=caps.get((minor, gi_id, cis[0].ci_id)) if cis else None,
                    )
                )
        return sorted(out, key=lambda g: g.gi_id)

    def gpu_instances(self, uuid: str) -> Sequence[GpuInstance]:
        """The GIs on the GPU; empty when MIG is off."""
        with self._guard():
            h = self._handle(uuid)
            if self._try(self._nvml.nvmlDeviceGetMigMode, h) is None:
                return ()
            return tuple(self._gpu_instances(h))

    def _gi(self, h: Any, uuid: str, gi_id: int) -> GpuInstance:
        for gi in self._gpu_instances(h):
            if gi.gi_id == gi_id:
                return gi
        raise HardwareError(ErrorCode.NOT_FOUND, f"GPU {uuid}: no GPU instance {gi_id}")

    def create_gpu_instance(self, uuid: str, profile_id: int, placement_start: int) -> GpuInstance:
        n = self._nvml
        with self._guard():
            h = self._handle(uuid)
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, profile_id)
            sizes = dict(self._placements(h, info))
            if placement_start not in sizes:
                raise HardwareError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"GPU {uuid}: placement {placement_start} not valid for profile {profile_id}",
                )
            placement = n.c_nvmlGpuInstancePlacement_t()
            placement.start = placement_start
            placement.size = sizes[placement_start]
            gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(placement))
            gi_id = int(n.nvmlGpuInstanceGetInfo(gi).id)
            return self._gi(h, uuid, gi_id)

    def create_compute_instance(self, uuid: str, gi_id: int) -> GpuInstance:
        n = self._nvml
        with self._guard():
            h = self._handle(uuid)
            gi = n.nvmlDeviceGetGpuInstanceById(h, gi_id)
            gi_profile = int(n.nvmlGpuInstanceGetInfo(gi).profileId)
            slices = next((int(i.sliceCount) for _, i in self._profile_infos(h) if int(i.id) == gi_profile), None)
            if slices is None or slices not in geometry.CI_PROFILE_BY_SLICES:
                raise HardwareError(ErrorCode.NOT_SUPPORTED, f"GPU {uuid} GI {gi_id}: unknown GI profile")
            ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                geometry.CI_PROFILE_BY_SLICES[slices],
                self._const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0),
            )
            n.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            return self._gi(h, uuid, gi_id)

    def destroy_compute_instance(self, uuid: str, gi_id: int, ci_id: int) -> None:
        n = self._nvml
        with self._guard():
            gi = n.nvmlDeviceGetGpuInstanceById(self._handle(uuid), gi_id)
            n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))

    def destroy_gpu_instance(self, uuid: str, gi_id: int) -> None:
        n = self._nvml
        with self._guard():
            n.nvmlGpuInstanceDestroy(n.nvmlDeviceGetGpuInstanceById(self._handle(uuid), gi_id))

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

    # --- health and telemetry ------------------------------------------------------------------

    def _ensure_event_set(self) -> Any:
        n = self._nvml
        if self._event_set is None:
            es = n.nvmlEventSetCreate()
            wanted = _EVENT_XID | _EVENT_DBE | _EVENT_SBE
            for index in range(int(n.nvmlDeviceGetCount())):
                h = n.nvmlDeviceGetHandleByIndex(index)
                supported = self._try(n.nvmlDeviceGetSupportedEventTypes, h, default=wanted)
                mask = int(supported) & wanted
                if mask:
                    self._try(n.nvmlDeviceRegisterEvents, h, mask, es)
            self._event_set = es
        return self._event_set

    def _to_event(self, data: Any) -> HealthEvent | None:
        n = self._nvml
        et = int(data.eventType)
        uuid = _text(n.nvmlDeviceGetUUID(data.device))
        now = time.time()
        if et & _EVENT_XID:
            xid = int(data.eventData)
            return HealthEvent(uuid=uuid, kind=HealthEventKind.XID, xid=xid, message=f"Xid {xid}", timestamp=now)
        if et & _EVENT_DBE:
            return HealthEvent(uuid=uuid, kind=HealthEventKind.ECC_DOUBLE_BIT, message="double-bit ECC", timestamp=now)
        if et & _EVENT_SBE:
            return HealthEvent(uuid=uuid, kind=HealthEventKind.ECC_SINGLE_BIT, message="single-bit ECC", timestamp=now)
        return None

    def wait_health_events(self, timeout_s: float) -> Sequence[HealthEvent]:
        """Xid and ECC events from NVML's event set. Waits in short slices so other calls are not starved."""
        n = self._nvml
        deadline = time.monotonic() + max(0.0, timeout_s)
        events: list[HealthEvent] = []
        while True:
            remaining = deadline - time.monotonic()
            slice_ms = 0 if events else int(max(0.0, min(self._event_slice_s, remaining)) * 1000)
            with self._guard():
                es = self._ensure_event_set()
                try:
                    data = n.nvmlEventSetWait_v2(es, slice_ms)
                except n.NVMLError as e:
                    if getattr(e, "value", None) != self._const("NVML_ERROR_TIMEOUT", 10):
                        raise
                    data = None
                if data is not None:
                    ev = self._to_event(data)
                    if ev is not None:
                        events.append(ev)
                    continue  # drain whatever else is queued
            if events or remaining <= 0:
                return tuple(events)

    def sample(self, uuid: str) -> DeviceSample:
        n = self._nvml
        with self._guard():
            h = self._handle(uuid)
            util = self._try(n.nvmlDeviceGetUtilizationRates, h)
            mem = self._try(n.nvmlDeviceGetMemoryInfo, h)
            temp = self._try(n.nvmlDeviceGetTemperature, h, self._const("NVML_TEMPERATURE_GPU", 0), default=0)
            power_mw = self._try(n.nvmlDeviceGetPowerUsage, h, default=0)
            reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            if reasons_fn is None:  # nvidia-ml-py before the 'event reasons' rename
                reasons_fn = n.nvmlDeviceGetCurrentClocksThrottleReasons
            reasons = self._try(reasons_fn, h, default=0)
            corrected = self._const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
            uncorrected = self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
            volatile = self._const("NVML_VOLATILE_ECC", 0)
            sbe = self._try(n.nvmlDeviceGetTotalEccErrors, h, corrected, volatile, default=0)
            dbe = self._try(n.nvmlDeviceGetTotalEccErrors, h, uncorrected, volatile, default=0)
            return DeviceSample(
                uuid=uuid,
                # NVML's utilization is "kernel running" time, a coarse stand-in for DCGM's SM active.
                sm_active=(int(util.gpu) / 100.0) if util is not None else 0.0,
                memory_used_bytes=int(mem.used) if mem is not None else 0,
                memory_bandwidth_util=(int(util.memory) / 100.0) if util is not None else 0.0,
                temperature_c=float(temp),
                power_w=float(power_mw) / 1000.0,
                throttle_reasons=int(reasons),
                ecc_sbe_total=int(sbe),
                ecc_dbe_total=int(dbe),
            )
