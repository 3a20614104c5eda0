"""NvmlBackend against a fake ``pynvml`` module: error translation, normalization and call shapes."""

from __future__ import annotations

import ctypes
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest

from gpuplane.driver.hw.caps import parse_mig_minors
from gpuplane.driver.hw.interface import ErrorCode, HardwareError, HealthEventKind
from gpuplane.driver.hw.nvml import NvmlBackend
from gpuplane.driver.hw.nvml_session import cuda_version_text, normalize_pci_bus_id
from gpuplane.mig import geometry, models

NS = types.SimpleNamespace


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class FabricV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint8),
    ]


def _fake(tmp_calls: list[tuple[str, Any]], *, p2p_ok: bool = True, fabric: bool = True) -> types.ModuleType:
    """Two H100s (handles 0 and 1) with MIG on GPU 0; profile info ids deliberately != constants."""
    m = types.ModuleType("pynvml")
    consts = {
        "NVML_SUCCESS": 0,
        "NVML_ERROR_INVALID_ARGUMENT": 2,
        "NVML_ERROR_NOT_SUPPORTED": 3,
        "NVML_ERROR_NO_PERMISSION": 4,
        "NVML_ERROR_NOT_FOUND": 6,
        "NVML_ERROR_TIMEOUT": 10,
        "NVML_ERROR_GPU_IS_LOST": 15,
        "NVML_ERROR_IN_USE": 19,
        "NVML_ERROR_INSUFFICIENT_RESOURCES": 23,
        "NVML_DEVICE_ARCH_AMPERE": 7,
        "NVML_DEVICE_ARCH_HOPPER": 9,
        "NVML_BRAND_NVIDIA": 14,
        "NVML_P2P_CAPS_INDEX_NVLINK": 2,
        "NVML_P2P_STATUS_OK": 0,
        "NVML_NVLINK_MAX_LINKS": 4,
        "NVML_FEATURE_ENABLED": 1,
        "NVML_DEVICE_MIG_ENABLE": 1,
        "NVML_DEVICE_MIG_DISABLE": 0,
        "NVML_GPU_INSTANCE_PROFILE_COUNT": 10,
        "NVML_COMPUTE_INSTANCE_PROFILE_COUNT": 8,
        "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED": 0,
    }
    for k, v in consts.items():
        setattr(m, k, v)
    m.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    m.c_nvmlGpuInstancePlacement_t = Placement  # type: ignore[attr-defined]
    m.c_nvmlGpuInstance_t = ctypes.c_void_p  # type: ignore[attr-defined]
    m.c_nvmlComputeInstance_t = ctypes.c_void_p  # type: ignore[attr-defined]
    gis: dict[int, tuple[int, int, int]] = {}  # gi_id -> (info id, start, size)
    uuids = ["GPU-aaaa", "GPU-bbbb"]
    events = [NS(device=1, eventType=0x8, eventData=79)]

    def rec(name: str, *args: Any) -> None:
        tmp_calls.append((name, args))

    def raise_(code: int) -> Any:
        raise FakeNVMLError(code)

    def handle_by_uuid(u: str) -> int:
        if u not in uuids:
            raise_(6)
        return uuids.index(u)

    def profile_info(h: int, const: int) -> Any:
        if h != 0 or models.H100_80GB.profile(const) is None:
            raise_(3)
        p = models.H100_80GB.profile(const)
        assert p is not None
        return NS(
            id=const + 100, sliceCount=p.compute_slices, instanceCount=p.max_count,
            multiprocessorCount=p.multiprocessors, memorySizeMB=p.memory_bytes >> 20,
            copyEngineCount=p.copy_engines, decoderCount=p.decoders, encoderCount=0,
            jpegCount=p.jpegs, ofaCount=p.ofas, name=f"MIG {p.name}".encode(),
        )  # fmt: skip

    def placements(h: int, info_id: int, arr: Any, count_ref: Any) -> None:
        rec("placements", info_id)
        p = models.H100_80GB.profile(info_id - 100)
        assert p is not None
        for i, s in enumerate(p.placements):
            arr[i].start, arr[i].size = s, p.memory_slices
        count_ref._obj.value = len(p.placements)

    def create_gi(h: int, info_id: int, placement_ref: Any) -> int:
        pl = placement_ref._obj
        rec("create_gi", info_id, pl.start, pl.size)
        gi_id = len(gis) + 1
        gis[gi_id] = (info_id, pl.start, pl.size)
        return 1000 + gi_id

    def get_gis(h: int, info_id: int, arr: Any, count_ref: Any) -> None:
        mine = [g for g, v in gis.items() if v[0] == info_id]
        for i, g in enumerate(mine):
            arr[i] = 1000 + g
        count_ref._obj.value = len(mine)

    def gi_info(gi: int) -> Any:
        info_id, start, size = gis[gi - 1000]
        return NS(id=gi - 1000, profileId=info_id, placement=NS(start=start, size=size))

    def fabric_fn(h: int, ref: Any) -> None:
        if not fabric:
            raise_(3)
        ref._obj.clusterUuid[:] = list(range(16))
        ref._obj.cliqueId, ref._obj.state, ref._obj.status = 7, 3, 0

    def p2p(a: int, b: int, idx: int) -> int:
        if not p2p_ok:
            raise_(3)
        return 0

    def event_wait(es: Any, ms: int) -> Any:
        if events:
            return events.pop()
        raise_(10)

    funcs = {
        "nvmlInit": lambda: rec("init"),
        "nvmlShutdown": lambda: rec("shutdown"),
        "nvmlSystemGetDriverVersion": lambda: "570.124.06",
        "nvmlSystemGetCudaDriverVersion": lambda: 12080,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetHandleByUUID": handle_by_uuid,
        "nvmlDeviceGetPciInfo": lambda h: NS(busId=[b"00000000:18:00.0", b"00000000:2A:00.0"][h]),
        "nvmlDeviceGetArchitecture": lambda h: 9,
        "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
        "nvmlDeviceGetMigMode": lambda h: [1, 1] if h == 0 else [0, 0],
        "nvmlDeviceGetAttributes": lambda h: NS(multiprocessorCount=132),
        "nvmlDeviceGetMinorNumber": lambda h: h + 4,
        "nvmlDeviceGetUUID": lambda h: uuids[h].encode(),
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetBrand": lambda h: 14,
        "nvmlDeviceGetMemoryInfo": lambda h: NS(total=80 << 30, used=1 << 30),
        "nvmlDeviceGetP2PStatus": p2p,
        "nvmlDeviceGetNvLinkState": lambda h, link: 1,
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: NS(busId="00000000:2a:00.0" if link == 2 else "x:y:z"),
        "nvmlDeviceGetGpuFabricInfoV": fabric_fn,
        "nvmlDeviceGetGpuInstanceProfileInfo": profile_info,
        "nvmlDeviceGetGpuInstancePossiblePlacements": placements,
        "nvmlDeviceCreateGpuInstanceWithPlacement": create_gi,
        "nvmlDeviceGetGpuInstances": get_gis,
        "nvmlGpuInstanceGetInfo": gi_info,
        "nvmlGpuInstanceGetComputeInstanceProfileInfo": lambda gi, c, e: raise_(3),
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 0,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [NS(pid=9, usedGpuMemory=None)],
        "nvmlEventSetCreate": lambda: "es",
        "nvmlDeviceGetSupportedEventTypes": lambda h: 0xB,
        "nvmlDeviceRegisterEvents": lambda h, mask, es: rec("register", h, mask),
        "nvmlEventSetWait_v2": event_wait,
        "nvmlEventSetFree": lambda es: rec("free"),
    }
    for k, f in funcs.items():
        setattr(m, k, f)
    m.c_nvmlGpuFabricInfo_v2_t = FabricV2  # type: ignore[attr-defined]
    return m


@pytest.fixture
def calls() -> list[tuple[str, Any]]:
    return []


def test_pure_helpers() -> None:
    assert normalize_pci_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert normalize_pci_bus_id(b"00000001:AB:00.0") == "0001:ab:00.0"
    assert normalize_pci_bus_id("18:00.0") == "0000:18:00.0"
    with pytest.raises(ValueError):
        normalize_pci_bus_id("garbage")
    assert cuda_version_text(12080) == "12.8" and cuda_version_text(12060) == "12.6"
    text = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu1/gi2/access 156\n"
    assert parse_mig_minors(text) == {(0, 0, None): 3, (0, 0, 0): 4, (1, 2, None): 156}


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (2, ErrorCode.INVALID_ARGUMENT),
        (3, ErrorCode.NOT_SUPPORTED),
        (4, ErrorCode.NO_PERMISSION),
        (6, ErrorCode.NOT_FOUND),
        (15, ErrorCode.GPU_IS_LOST),
        (19, ErrorCode.IN_USE),
        (23, ErrorCode.INSUFFICIENT_RESOURCES),
        (999, ErrorCode.UNKNOWN),
    ],
)
def test_error_translation(calls: list[tuple[str, Any]], value: int, code: ErrorCode) -> None:
    assert NvmlBackend(_fake(calls)).translate(FakeNVMLError(value)).code is code


def test_inventory_and_lifecycle(calls: list[tuple[str, Any]], tmp_path: Path) -> None:
    backend = NvmlBackend(_fake(calls), sysfs_pci_root=tmp_path)
    with backend:
        g0, g1 = backend.gpus()
        assert (g0.uuid, g0.minor, g0.pci_bus_id, g1.pci_bus_id) == ("GPU-aaaa", 4, "0000:18:00.0", "0000:2a:00.0")
        assert (g0.architecture, g0.brand, g0.cuda_compute_capability, g0.cuda_driver_version) == (
            "hopper", "nvidia", "9.0", "12.8",
        )  # fmt: skip
        assert g0.mig_capable and not g0.mig_toggle_needs_reset and g0.multiprocessors == 132
        assert backend.nvlink_p2p("GPU-aaaa", "GPU-bbbb")
        assert backend.processes("GPU-aaaa")[0].used_memory_bytes == 0
        with pytest.raises(HardwareError) as e:
            backend.mig_mode("GPU-nope")
        assert e.value.code is ErrorCode.NOT_FOUND
        fab = backend.fabric_info("GPU-aaaa")
        assert fab.completed and fab.clique_id == 7 and fab.cluster_uuid.startswith("00010203-")
    assert calls[0][0] == "init" and calls[-1][0] == "shutdown"


def test_nvlink_fallback_and_no_fabric(calls: list[tuple[str, Any]]) -> None:
    with NvmlBackend(_fake(calls, p2p_ok=False, fabric=False)) as b:
        assert b.nvlink_p2p("GPU-aaaa", "GPU-bbbb")  # via the per-link remote PCI id
        assert not b.fabric_info("GPU-aaaa").completed


def test_mig_calls_use_profile_info_id(calls: list[tuple[str, Any]]) -> None:
    with NvmlBackend(_fake(calls)) as b:
        profiles = b.mig_profiles("GPU-aaaa")
        assert [p.name for p in profiles] == [
            p.name for p in sorted(models.H100_80GB.profiles, key=lambda p: p.profile_id)
        ]
        assert all(p.info_id == p.profile_id + 100 for p in profiles)
        gi = b.create_gpu_instance("GPU-aaaa", geometry.GI_PROFILE_3_SLICE, 4)
        assert ("create_gi", (102, 4, 4)) in calls
        assert (gi.profile_id, gi.placement_start, gi.placement_size) == (2, 4, 4)
        with pytest.raises(HardwareError) as e:
            b.create_gpu_instance("GPU-aaaa", geometry.GI_PROFILE_3_SLICE, 2)
        assert e.value.code is ErrorCode.INVALID_ARGUMENT
        assert b.gpu_instances("GPU-bbbb") == ()


def test_timeslice_shells_out(calls: list[tuple[str, Any]]) -> None:
    seen: list[list[str]] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        rc, err = (0, "") if argv[-1].endswith("=2") else (1, "Setting time slice is Not Supported")
        return subprocess.CompletedProcess(argv, rc, "", err)

    b = NvmlBackend(_fake(calls), run=run)
    b.set_timeslice("GPU-aaaa", "Medium")
    assert seen[0] == ["nvidia-smi", "compute-policy", "-i", "GPU-aaaa", "--set-timeslice=2"]
    with pytest.raises(HardwareError) as e:
        b.set_timeslice("GPU-aaaa", "Long")
    assert e.value.code is ErrorCode.NOT_SUPPORTED
    with pytest.raises(HardwareError) as e:
        b.set_timeslice("GPU-aaaa", "Forever")
    assert e.value.code is ErrorCode.INVALID_ARGUMENT


def test_health_events(calls: list[tuple[str, Any]]) -> None:
    with NvmlBackend(_fake(calls), event_slice_s=0.01) as b:
        (ev,) = b.wait_health_events(0.05)
        assert (ev.uuid, ev.kind, ev.xid) == ("GPU-bbbb", HealthEventKind.XID, 79)
        assert b.wait_health_events(0.02) == ()
    assert ("register", (0, 0xB)) in calls and ("free", ()) in calls
