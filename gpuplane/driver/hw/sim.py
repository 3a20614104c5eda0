"""A GPU simulator that implements :class:`~gpuplane.driver.hw.interface.GpuBackend` the way NVML behaves.

Configured by :class:`SimConfig` (:mod:`gpuplane.driver.hw.sim_config`: a named node profile from
:mod:`gpuplane.driver.hw.sim_profiles` plus node identity). Its state behaves like hardware state
(:mod:`gpuplane.driver.hw.sim_store`): MIG mode, GPU/compute instances, time-slice settings,
injected processes, pending health events and telemetry overrides live in
``<state_dir>/sim-state.json``. Every operation re-reads that file under a file lock and writes it
back atomically, so

- MIG instances survive a SIGKILL and restart of the driver process, like real hardware;
- another process (a test, :mod:`gpuplane.driver.hw.sim_cli`) can inject events or processes while the
  driver runs, and the driver sees them on its next call (no stale in-memory cache).

Errors follow NVML's return codes (see :mod:`gpuplane.mig.rules` for the placement rules).
Simulator-only operations (``reset_gpu``, ``reboot``, ``inject_event``, ...) are plain methods
that the production interface does not have (:mod:`gpuplane.driver.hw.sim_controls`). This module:
the :class:`~gpuplane.driver.hw.interface.GpuBackend` calls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuplane.driver.hw import caps
from gpuplane.driver.hw.interface import (
    ComputeInstance,
    DeviceSample,
    ErrorCode,
    FabricInfo,
    GpuInfo,
    GpuInstance,
    HealthEvent,
    HealthEventKind,
    MigMode,
    Process,
)
from gpuplane.driver.hw.sim_config import SimConfig, gpu_uuid, mig_uuid
from gpuplane.driver.hw.sim_controls import THROTTLE_GPU_IDLE, SimControls
from gpuplane.driver.hw.sim_store import STATE_FILE, err
from gpuplane.mig import geometry, models, rules
from gpuplane.mig.models import MigProfile

__all__ = ["STATE_FILE", "SimConfig", "Simulator", "gpu_uuid", "mig_uuid"]

TIMESLICE_INTERVALS = ("Default", "Short", "Medium", "Long")


class Simulator(SimControls):
    """The simulated backend. One instance per process; any number of processes per state dir."""

    name = "sim"

    # --- lifecycle -----------------------------------------------------------------

    def init(self) -> None:
        with self._lock:
            with self._locked_state(write=True) as st:
                st["config"] = self.config.model_dump(mode="json")
            self._initialized = True

    def shutdown(self) -> None:
        with self._lock:
            self._initialized = False

    def __enter__(self) -> Simulator:
        self.init()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    def device_node_dir(self) -> Path:
        """``<state_dir>/dev``: the placeholder nodes of :mod:`gpuplane.driver.hw.sim_devnodes`."""
        return self._devnodes.directory

    def _model(self, uuid: str) -> models.MigModel:
        model = self.profile.gpu.mig_model
        if model is None:
            raise err(ErrorCode.NOT_SUPPORTED, f"GPU {uuid} ({self.profile.gpu.product_name}) is not MIG-capable")
        return model

    def _mig_gpu(self, st: dict[str, Any], uuid: str) -> tuple[dict[str, Any], models.MigModel]:
        rec = self._gpu(st, uuid)
        model = self._model(uuid)
        if not rec["mig_current"]:
            raise err(ErrorCode.NOT_SUPPORTED, f"MIG mode is disabled on GPU {uuid}")
        return rec, model

    @staticmethod
    def _find_gi(rec: dict[str, Any], uuid: str, gi_id: int) -> dict[str, Any]:
        for gi in rec["gis"]:
            if gi["gi_id"] == gi_id:
                found: dict[str, Any] = gi  # the stored dict itself, mutated in place by callers
                return found
        raise err(ErrorCode.NOT_FOUND, f"GPU {uuid}: no GPU instance {gi_id}")

    def _to_gi(self, rec: dict[str, Any], gi: dict[str, Any]) -> GpuInstance:
        cis = tuple(ComputeInstance(ci_id=c["ci_id"], profile_id=c["profile_id"]) for c in gi["cis"])
        gi_minor, ci_minor = caps.caps_minors(rec["minor"], gi["gi_id"], cis[0].ci_id if cis else None)
        return GpuInstance(
            gi_id=gi["gi_id"],
            profile_id=gi["profile_id"],
            placement_start=gi["start"],
            placement_size=gi["size"],
            compute_instances=cis,
            mig_uuid=gi["mig_uuid"],
            gi_caps_minor=gi_minor,
            ci_caps_minor=ci_minor,
        )

    # --- inventory -------------------------------------------------------------------

    def gpus(self) -> Sequence[GpuInfo]:
        with self._op(write=False):
            cfg, prof, spec = self.config, self.profile, self.profile.gpu
            present = [m for m in range(prof.gpu_count) if m not in self._absent]
            return tuple(
                GpuInfo(
                    index=index,
                    minor=minor,
                    uuid=self._uuid_by_minor[minor],
                    pci_bus_id=prof.pci_bus_id(minor),
                    product_name=spec.product_name,
                    brand=spec.brand,
                    architecture=spec.architecture,
                    cuda_compute_capability=spec.cuda_compute_capability,
                    driver_version=cfg.driver_version,
                    cuda_driver_version=cfg.cuda_version,
                    memory_bytes=spec.memory_bytes,
                    multiprocessors=spec.multiprocessors,
                    mig_capable=spec.mig_model is not None,
                    mig_toggle_needs_reset=spec.mig_toggle_needs_reset,
                    pcie_root=prof.pcie_root(minor),
                )
                for index, minor in enumerate(present)
            )

    def nvlink_p2p(self, uuid_a: str, uuid_b: str) -> bool:
        with self._op(write=False) as st:
            a = self._gpu(st, uuid_a)["minor"]
            b = self._gpu(st, uuid_b)["minor"]
            return self.profile.nvlink_peers(a, b)

    def fabric_info(self, uuid: str) -> FabricInfo:
        with self._op(write=False) as st:
            self._gpu(st, uuid)
            if not self.profile.reports_fabric:
                return FabricInfo(cluster_uuid="", clique_id=0, state=FabricInfo.FABRIC_STATE_NOT_SUPPORTED)
            cluster, clique = self.config.fabric_identity()
            return FabricInfo(cluster_uuid=cluster, clique_id=clique, state=FabricInfo.FABRIC_STATE_COMPLETED)

    def processes(self, uuid: str) -> Sequence[Process]:
        with self._op(write=False) as st:
            rec = self._gpu(st, uuid)
            return tuple(Process(pid=p["pid"], used_memory_bytes=p["mem"]) for p in rec["processes"])

    # --- MIG ---------------------------------------------------------------------------

    def mig_mode(self, uuid: str) -> MigMode:
        with self._op(write=False) as st:
            rec = self._gpu(st, uuid)
            self._model(uuid)
            return MigMode(current=rec["mig_current"], pending=rec["mig_pending"])

    def set_mig_mode(self, uuid: str, enabled: bool) -> MigMode:
        with self._op(write=True) as st:
            rec = self._gpu(st, uuid)
            self._model(uuid)
            if rec["processes"]:
                raise err(ErrorCode.IN_USE, f"GPU {uuid}: {len(rec['processes'])} processes running")
            if not enabled and rec["gis"]:
                raise err(ErrorCode.IN_USE, f"GPU {uuid}: GPU instances exist; destroy them first")
            rec["mig_pending"] = enabled
            if not self.profile.gpu.mig_toggle_needs_reset:
                rec["mig_current"] = enabled
            return MigMode(current=rec["mig_current"], pending=rec["mig_pending"])

    def mig_profiles(self, uuid: str) -> Sequence[MigProfile]:
        with self._op(write=False) as st:
            self._gpu(st, uuid)
            model = self.profile.gpu.mig_model
            return () if model is None else model.profiles

    def gpu_instances(self, uuid: str) -> Sequence[GpuInstance]:
        """The GIs on the GPU; empty when MIG is off or unsupported."""
        with self._op(write=False) as st:
            rec = self._gpu(st, uuid)
            if self.profile.gpu.mig_model is None or not rec["mig_current"]:
                return ()
            return tuple(self._to_gi(rec, gi) for gi in sorted(rec["gis"], key=lambda g: g["gi_id"]))

    def create_gpu_instance(self, uuid: str, profile_id: int, placement_start: int) -> GpuInstance:
        with self._op(write=True, latency=True) as st:
            rec, model = self._mig_gpu(st, uuid)
            existing = [(g["profile_id"], g["start"]) for g in rec["gis"]]
            refusal = rules.check_create(model, existing, profile_id, placement_start)
            if refusal is not None:
                raise err(ErrorCode(refusal.code.value), f"GPU {uuid}: {refusal.reason}")
            prof = model.profile(profile_id)
            assert prof is not None
            used = {g["gi_id"] for g in rec["gis"]}
            gi_id = next(i for i in range(len(used) + 1) if i not in used)
            gi = {
                "gi_id": gi_id,
                "profile_id": profile_id,
                "start": placement_start,
                "size": prof.memory_slices,
                "cis": [],
                "mig_uuid": None,
            }
            rec["gis"].append(gi)
            return self._to_gi(rec, gi)

    def create_compute_instance(self, uuid: str, gi_id: int) -> GpuInstance:
        with self._op(write=True, latency=True) as st:
            rec, model = self._mig_gpu(st, uuid)
            gi = self._find_gi(rec, uuid, gi_id)
            if gi["cis"]:
                raise err(ErrorCode.INSUFFICIENT_RESOURCES, f"GPU {uuid} GI {gi_id}: compute instance exists")
            prof = model.profile(gi["profile_id"])
            assert prof is not None
            st["mig_generation"] = int(st.get("mig_generation", 0)) + 1
            gi["cis"] = [{"ci_id": 0, "profile_id": geometry.CI_PROFILE_BY_SLICES[prof.compute_slices]}]
            gi["mig_uuid"] = mig_uuid(uuid, gi_id, st["mig_generation"])
            return self._to_gi(rec, gi)

    def destroy_compute_instance(self, uuid: str, gi_id: int, ci_id: int) -> None:
        with self._op(write=True, latency=True) as st:
            rec, _ = self._mig_gpu(st, uuid)
            gi = self._find_gi(rec, uuid, gi_id)
            remaining = [c for c in gi["cis"] if c["ci_id"] != ci_id]
            if len(remaining) == len(gi["cis"]):
                raise err(ErrorCode.NOT_FOUND, f"GPU {uuid} GI {gi_id}: no compute instance {ci_id}")
            gi["cis"] = remaining
            if not remaining:
                gi["mig_uuid"] = None

    def destroy_gpu_instance(self, uuid: str, gi_id: int) -> None:
        with self._op(write=True, latency=True) as st:
            rec, _ = self._mig_gpu(st, uuid)
            gi = self._find_gi(rec, uuid, gi_id)
            if gi["cis"]:
                raise err(ErrorCode.IN_USE, f"GPU {uuid} GI {gi_id}: compute instances still exist")
            rec["gis"] = [g for g in rec["gis"] if g["gi_id"] != gi_id]

    # --- sharing -------------------------------------------------------------------------

    def set_timeslice(self, uuid: str, interval: str) -> None:
        with self._op(write=True) as st:
            rec = self._gpu(st, uuid)
            if interval not in TIMESLICE_INTERVALS:
                raise err(ErrorCode.INVALID_ARGUMENT, f"time-slice {interval!r} not in {TIMESLICE_INTERVALS}")
            if rec["mig_current"]:
                raise err(ErrorCode.NOT_SUPPORTED, f"GPU {uuid} is in MIG mode; time-slice applies to full GPUs")
            rec["timeslice"] = interval

    # --- health and telemetry ---------------------------------------------------------------

    def wait_health_events(self, timeout_s: float) -> Sequence[HealthEvent]:
        """Injected events (consumed), waiting up to ``timeout_s`` for the first one."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._op(write=False) as st:
                pending = bool(st["events"])
            if pending:
                with self._op(write=True) as st:
                    raw, st["events"] = st["events"], []
                out = []
                for e in raw:
                    minor = self._minor_by_uuid.get(e["uuid"])
                    if minor is None or minor in self._absent:
                        continue
                    out.append(
                        HealthEvent(
                            uuid=e["uuid"],
                            kind=HealthEventKind(e["kind"]),
                            xid=e["xid"],
                            message=e["message"],
                            timestamp=e["timestamp"],
                        )
                    )
                if out:
                    return tuple(out)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ()
            time.sleep(min(self.config.poll_interval_s, remaining))

    def sample(self, uuid: str) -> DeviceSample:
        with self._op(write=False) as st:
            rec = self._gpu(st, uuid)
            tel: dict[str, Any] = rec["telemetry"]
            procs = rec["processes"]
            sm_active = float(tel.get("sm_active", 0.0))
            throttle = int(tel.get("throttle_reasons", rec["throttle"]))
            if not procs and sm_active == 0.0:
                throttle |= THROTTLE_GPU_IDLE
            ppb = {int(k): float(v) for k, v in tel.get("per_process_bandwidth", {}).items()}
            return DeviceSample(
                uuid=uuid,
                sm_active=sm_active,
                memory_used_bytes=int(tel.get("memory_used_bytes", sum(p["mem"] for p in procs))),
                memory_bandwidth_util=float(tel.get("memory_bandwidth_util", 0.0)),
                temperature_c=float(tel.get("temperature_c", 34.0)),
                power_w=float(tel.get("power_w", self.profile.gpu.idle_power_w)),
                throttle_reasons=throttle,
                ecc_sbe_total=int(tel.get("ecc_sbe_total", rec["ecc_sbe"])),
                ecc_dbe_total=int(tel.get("ecc_dbe_total", rec["ecc_dbe"])),
                per_process_bandwidth=ppb,
            )
