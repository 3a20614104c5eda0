"""MIG through NVML: mode, profiles, GPU and compute instances, create and destroy.

GI placement and creation take the profile *info id*, not the profile constant. A MIG-capable
GPU with MIG mode off reports no profiles; the static table (:mod:`gpuplane.mig.models`) stands
in. The caps minors of each instance come from ``/proc/driver/nvidia-caps/mig-minors``.
Side effects: :meth:`NvmlMig.set_mig_mode` and the create/destroy calls change the GPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuplane.driver.hw.caps import parse_mig_minors
from gpuplane.driver.hw.interface import ComputeInstance, ErrorCode, GpuInstance, HardwareError, MigMode
from gpuplane.driver.hw.nvml_session import NvmlSession, text
from gpuplane.mig import geometry, models
from gpuplane.mig.models import MigProfile

_MIB = 1024 * 1024
_MAX_PLACEMENTS = 32


class NvmlMig(NvmlSession):
    """The MIG half of :class:`~gpuplane.driver.hw.nvml.NvmlBackend`."""

    _mig_minors_path: Path

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
                name = text(getattr(info, "name", b"") or b"").removeprefix("MIG ").strip()
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
                model = models.model_for_product(text(n.nvmlDeviceGetName(h)))
                return () if model is None else model.profiles
            return tuple(out)

    def _mig_uuids(self, h: Any) -> dict[int, str]:
        n = self._nvml
        out: dict[int, str] = {}
        for i in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
            mh = self._try(n.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            if mh is None:
                continue
            out[int(n.nvmlDeviceGetGpuInstanceId(mh))] = text(n.nvmlDeviceGetUUID(mh))
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
