"""A GPU simulator that implements :class:`~gpuplane.driver.hw.interface.GpuBackend` the way NVML behaves.

Configured by :class:`SimConfig` (a named node profile from :mod:`gpuplane.driver.hw.sim_profiles` plus node
identity). Its state behaves like hardware state: MIG mode, GPU/compute instances, time-slice
settings, injected processes, pending health events and telemetry overrides live in
``<state_dir>/sim-state.json``. Every operation re-reads that file under an ``fcntl`` lock on
``<state_dir>/sim-state.lock`` and writes it back atomically (temp file, fsync, rename), so

- MIG instances survive a SIGKILL and restart of the driver process, like real hardware;
- another process (a test, :mod:`gpuplane.driver.hw.sim_cli`) can inject events or processes while the
  driver runs, and the driver sees them on its next call (no stale in-memory cache).

Errors follow NVML's return codes (see :mod:`gpuplane.mig.rules` for the placement rules).
Simulator-only operations (``reset_gpu``, ``reboot``, ``inject_event``, ...) are plain methods
that the production interface does not have.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuplane.driver.host import atomic_write, file_lock
from gpuplane.driver.hw import caps, sim_profiles
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
from gpuplane.mig import geometry, models, rules
from gpuplane.mig.models import MigProfile

STATE_FILE = "sim-state.json"
LOCK_FILE = "sim-state.lock"
STATE_VERSION = 1
TIMESLICE_INTERVALS = ("Default", "Short", "Medium", "Long")

# NVML clocks-event reasons (nvmlClocksEventReason*).
THROTTLE_GPU_IDLE = 0x1
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80

XID_FALLEN_OFF_BUS = 79

_DEFAULT_CLUSTER_UUID = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "gpuplane-sim/default-nvl72-rack"))
_DEFAULT_CLIQUE_ID = 1

# Telemetry override keys accepted by set_telemetry (aliases map to DeviceSample field names).
_TELEMETRY_KEYS = {
    "sm_active": "sm_active",
    "memory_bandwidth_util": "memory_bandwidth_util",
    "temperature_c": "temperature_c",
    "temperature": "temperature_c",
    "power_w": "power_w",
    "power": "power_w",
    "memory_used_bytes": "memory_used_bytes",
    "throttle_reasons": "throttle_reasons",
    "ecc_sbe_total": "ecc_sbe_total",
    "ecc_dbe_total": "ecc_dbe_total",
    "per_process_bandwidth": "per_process_bandwidth",
}


class SimConfig(BaseModel):
    """Configuration of one simulated node. Load with :meth:`from_file` or build from kwargs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str
    state_dir: Path
    node_name: str = "sim-node"
    driver_version: str = "570.124.06"
    cuda_version: str = "12.8"
    # Multi-node NVLink identity (profiles that report fabric only); shared by the nodes of one rack.
    cluster_uuid: str | None = None
    clique_id: int | None = Field(default=None, ge=0)
    # Minors of GPUs that have fallen off the bus: not enumerated, later indexes shift.
    absent_minors: tuple[int, ...] = ()
    # MIG mode of a GPU (by minor) when the state file is first created.
    initial_mig_mode: dict[int, bool] = Field(default_factory=dict)
    # Artificial delay per MIG create/destroy operation.
    op_latency_s: float = Field(default=0.0, ge=0.0)
    # fsync state writes (turn off only in tests that do thousands of operations).
    durable: bool = True
    poll_interval_s: float = Field(default=0.05, gt=0.0)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        sim_profiles.node_profile(v)
        return v

    @field_validator("cluster_uuid")
    @classmethod
    def _canonical_uuid(cls, v: str | None) -> str | None:
        return None if v is None else str(uuidlib.UUID(v))

    @model_validator(mode="after")
    def _check_minors(self) -> SimConfig:
        prof = sim_profiles.node_profile(self.profile)
        for m in (*self.absent_minors, *self.initial_mig_mode):
            if not 0 <= m < prof.gpu_count:
                raise ValueError(f"minor {m} out of range for {self.profile} ({prof.gpu_count} GPUs)")
        if any(self.initial_mig_mode.values()) and prof.gpu.mig_model is None:
            raise ValueError(f"{self.profile} GPUs are not MIG-capable")
        return self

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **overrides: Any) -> SimConfig:
        """Load from a YAML or JSON file (JSON is YAML); ``overrides`` win over file values."""
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping")
        data.update(overrides)
        return cls.model_validate(data)

    def fabric_identity(self) -> tuple[str, int]:
        clique = _DEFAULT_CLIQUE_ID if self.clique_id is None else self.clique_id
        return (self.cluster_uuid or _DEFAULT_CLUSTER_UUID, clique)


def _uuid_from(text: str) -> str:
    return str(uuidlib.UUID(bytes=hashlib.sha256(text.encode()).digest()[:16], version=4))


def gpu_uuid(node_name: str, minor: int) -> str:
    """Deterministic GPU UUID of a simulated GPU: same node name and minor, same UUID."""
    return f"GPU-{_uuid_from(f'gpuplane-sim/{node_name}/gpu/{minor}')}"


def mig_uuid(parent_uuid: str, gi_id: int, generation: int) -> str:
    return f"MIG-{_uuid_from(f'{parent_uuid}/gi/{gi_id}/gen/{generation}')}"


def _err(code: ErrorCode, msg: str) -> HardwareError:
    return HardwareError(code, msg)


class Simulator:
    """The simulated backend. One instance per process; any number of processes per state dir."""

    name = "sim"

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.profile = sim_profiles.node_profile(config.profile)
        self.sim_time_s = 0.0  # wall time spent inside simulator calls (includes op_latency_s)
        self._lock = threading.RLock()
        self._initialized = False
        self._state_path = config.state_dir / STATE_FILE
        self._lock_path = config.state_dir / LOCK_FILE
        self._uuid_by_minor = {m: gpu_uuid(config.node_name, m) for m in range(self.profile.gpu_count)}
        self._minor_by_uuid = {u: m for m, u in self._uuid_by_minor.items()}
        self._absent = frozenset(config.absent_minors)

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

    # --- state file ----------------------------------------------------------------

    def _fresh_gpu(self, minor: int) -> dict[str, Any]:
        mig = bool(self.config.initial_mig_mode.get(minor, False))
        return {
            "minor": minor,
            "mig_current": mig,
            "mig_pending": mig,
            "gis": [],
            "timeslice": "Default",
            "processes": [],
            "telemetry": {},
            "throttle": 0,
            "lost": False,
            "ecc_sbe": 0,
            "ecc_dbe": 0,
        }

    def _fresh_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "boot_id": str(uuidlib.uuid4()),
            "mig_generation": 0,
            "events": [],
            "gpus": {},
        }

    def _read_state(self) -> dict[str, Any]:
        try:
            raw = self._state_path.read_bytes()
        except FileNotFoundError:
            st = self._fresh_state()
        else:
            try:
                st = json.loads(raw)
            except ValueError as e:
                raise _err(ErrorCode.UNKNOWN, f"simulator state {self._state_path} is corrupt: {e}") from e
            if not isinstance(st, dict) or st.get("version") != STATE_VERSION:
                raise _err(ErrorCode.UNKNOWN, f"simulator state {self._state_path}: unsupported version")
        gpus = st.setdefault("gpus", {})
        for minor, u in self._uuid_by_minor.items():
            if u not in gpus:
                gpus[u] = self._fresh_gpu(minor)
        return st

    def _write_state(self, st: dict[str, Any]) -> None:
        data = json.dumps(st, indent=1, sort_keys=True).encode()
        atomic_write(self._state_path, data, 0o644, durable=self.config.durable)

    @contextlib.contextmanager
    def _locked_state(self, *, write: bool) -> Iterator[dict[str, Any]]:
        """Read the state under the file lock; write it back if ``write`` and the body did not raise."""
        with file_lock(self._lock_path, shared=not write, mode=0o644):
            st = self._read_state()
            yield st
            if write:
                self._write_state(st)

    @contextlib.contextmanager
    def _op(self, *, write: bool, latency: bool = False) -> Iterator[dict[str, Any]]:
        """One simulated NVML call: serialized, timed, on freshly read state."""
        t0 = time.monotonic()
        with self._lock:
            try:
                if not self._initialized:
                    raise _err(ErrorCode.UNINITIALIZED, "simulator not initialized (call init())")
                if latency and self.config.op_latency_s > 0:
                    time.sleep(self.config.op_latency_s)
                with self._locked_state(write=write) as st:
                    yield st
            finally:
                self.sim_time_s += time.monotonic() - t0

    def _gpu(self, st: dict[str, Any], uuid: str, *, allow_lost: bool = False) -> dict[str, Any]:
        minor = self._minor_by_uuid.get(uuid)
        if minor is None or minor in self._absent:
            raise _err(ErrorCode.NOT_FOUND, f"no GPU with uuid {uuid}")
        rec: dict[str, Any] = st["gpus"][uuid]
        if rec["lost"] and not allow_lost:
            raise _err(ErrorCode.GPU_IS_LOST, f"GPU {uuid} has fallen off the bus")
        return rec

    def _model(self, uuid: str) -> models.MigModel:
        model = self.profile.gpu.mig_model
        if model is None:
            raise _err(ErrorCode.NOT_SUPPORTED, f"GPU {uuid} ({self.profile.gpu.product_name}) is not MIG-capable")
        return model

    def _mig_gpu(self, st: dict[str, Any], uuid: str) -> tuple[dict[str, Any], models.MigModel]:
        rec = self._gpu(st, uuid)
        model = self._model(uuid)
        if not rec["mig_current"]:
            raise _err(ErrorCode.NOT_SUPPORTED, f"MIG mode is disabled on GPU {uuid}")
        return rec, model

    @staticmethod
    def _find_gi(rec: dict[str, Any], uuid: str, gi_id: int) -> dict[str, Any]:
        for gi in rec["gis"]:
            if gi["gi_id"] == gi_id:
                found: dict[str, Any] = gi  # the stored dict itself, mutated in place by callers
                return found
        raise _err(ErrorCode.NOT_FOUND, f"GPU {uuid}: no GPU instance {gi_id}")

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
                raise _err(ErrorCode.IN_USE, f"GPU {uuid}: {len(rec['processes'])} processes running")
            if not enabled and rec["gis"]:
                raise _err(ErrorCode.IN_USE, f"GPU {uuid}: GPU instances exist; destroy them first")
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
                raise _err(ErrorCode(refusal.code.value), f"GPU {uuid}: {refusal.reason}")
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
                raise _err(ErrorCode.INSUFFICIENT_RESOURCES, f"GPU {uuid} GI {gi_id}: compute instance exists")
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
                raise _err(ErrorCode.NOT_FOUND, f"GPU {uuid} GI {gi_id}: no compute instance {ci_id}")
            gi["cis"] = remaining
            if not remaining:
                gi["mig_uuid"] = None

    def destroy_gpu_instance(self, uuid: str, gi_id: int) -> None:
        with self._op(write=True, latency=True) as st:
            rec, _ = self._mig_gpu(st, uuid)
            gi = self._find_gi(rec, uuid, gi_id)
            if gi["cis"]:
                raise _err(ErrorCode.IN_USE, f"GPU {uuid} GI {gi_id}: compute instances still exist")
            rec["gis"] = [g for g in rec["gis"] if g["gi_id"] != gi_id]

    # --- sharing -------------------------------------------------------------------------

    def set_timeslice(self, uuid: str, interval: str) -> None:
        with self._op(write=True) as st:
            rec = self._gpu(st, uuid)
            if interval not in TIMESLICE_INTERVALS:
                raise _err(ErrorCode.INVALID_ARGUMENT, f"time-slice {interval!r} not in {TIMESLICE_INTERVALS}")
            if rec["mig_current"]:
                raise _err(ErrorCode.NOT_SUPPORTED, f"GPU {uuid} is in MIG mode; time-slice applies to full GPUs")
            rec["timeslice"] = interval

    def timeslice(self, uuid: str) -> str:
        """Simulator-only: the stored time-slice interval class."""
        with self._op(write=False) as st:
            return str(self._gpu(st, uuid)["timeslice"])

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

    # --- simulator-only controls (tests, CLI, harness) ------------------------------------------

    def uuid_of_minor(self, minor: int) -> str:
        return self._uuid_by_minor[minor]

    def reset_gpu(self, uuid: str) -> MigMode:
        """Simulated GPU reset: applies a pending MIG mode, wipes MIG instances, clears a lost state.

        Refused with IN_USE while processes run (as ``nvidia-smi -r`` is).
        """
        with self._op(write=True) as st:
            rec = self._gpu(st, uuid, allow_lost=True)
            if rec["processes"]:
                raise _err(ErrorCode.IN_USE, f"GPU {uuid}: cannot reset with processes running")
            rec["mig_current"] = rec["mig_pending"]
            rec["gis"] = []
            rec["lost"] = False
            rec["throttle"] = 0
            rec["timeslice"] = "Default"
            return MigMode(current=rec["mig_current"], pending=rec["mig_pending"])

    def reboot(self) -> str:
        """Simulated node reboot: new boot id; MIG instances, processes and events are gone.

        MIG mode persists (pending modes take effect), as on real GPUs. Returns the new boot id.
        """
        with self._op(write=True) as st:
            st["boot_id"] = str(uuidlib.uuid4())
            st["events"] = []
            for rec in st["gpus"].values():
                rec.update(mig_current=rec["mig_pending"], gis=[], processes=[], telemetry={}, throttle=0, lost=False)
                rec["timeslice"] = "Default"
            return str(st["boot_id"])

    def boot_id(self) -> str:
        with self._op(write=False) as st:
            return str(st["boot_id"])

    def inject_event(self, uuid: str, kind: HealthEventKind | str, xid: int = 0, message: str = "") -> HealthEvent:
        """Queue a health event and apply its side effect on the simulated GPU."""
        k = HealthEventKind(kind)
        event = HealthEvent(
            uuid=uuid,
            kind=k,
            xid=xid,
            message=message or (f"Xid {xid}" if xid else k.value),
            timestamp=time.time(),
        )
        with self._op(write=True) as st:
            rec = self._gpu(st, uuid, allow_lost=True)
            if k is HealthEventKind.ECC_DOUBLE_BIT:
                rec["ecc_dbe"] += 1
            elif k is HealthEventKind.ECC_SINGLE_BIT:
                rec["ecc_sbe"] += 1
            elif k is HealthEventKind.GPU_LOST or (k is HealthEventKind.XID and xid == XID_FALLEN_OFF_BUS):
                rec["lost"] = True
            elif k is HealthEventKind.THERMAL:
                rec["throttle"] |= THROTTLE_HW_THERMAL | THROTTLE_SW_THERMAL
            elif k is HealthEventKind.POWER:
                rec["throttle"] |= THROTTLE_HW_POWER_BRAKE | THROTTLE_SW_POWER_CAP
            elif k is HealthEventKind.CLEARED:
                rec["throttle"] = 0
            st["events"].append(
                {
                    "uuid": uuid,
                    "kind": k.value,
                    "xid": xid,
                    "message": event.message,
                    "timestamp": event.timestamp,
                }
            )
        return event

    def set_telemetry(self, uuid: str, overrides: Mapping[str, Any]) -> None:
        """Override telemetry values returned by :meth:`sample` (a None value removes an override)."""
        with self._op(write=True) as st:
            rec = self._gpu(st, uuid, allow_lost=True)
            for key, value in overrides.items():
                field = _TELEMETRY_KEYS.get(key)
                if field is None:
                    raise _err(ErrorCode.INVALID_ARGUMENT, f"unknown telemetry key {key!r}")
                if value is None:
                    rec["telemetry"].pop(field, None)
                elif field == "per_process_bandwidth":
                    rec["telemetry"][field] = {str(int(k)): float(v) for k, v in dict(value).items()}
                else:
                    rec["telemetry"][field] = value

    def add_process(self, uuid: str, pid: int, mem_bytes: int) -> None:
        with self._op(write=True) as st:
            rec = self._gpu(st, uuid, allow_lost=True)
            rec["processes"] = [p for p in rec["processes"] if p["pid"] != pid]
            rec["processes"].append({"pid": pid, "mem": mem_bytes})

    def clear_processes(self, uuid: str | None = None) -> None:
        with self._op(write=True) as st:
            recs = [self._gpu(st, uuid, allow_lost=True)] if uuid else list(st["gpus"].values())
            for rec in recs:
                rec["processes"] = []

    def dump_state(self) -> dict[str, Any]:
        """The whole state file content, with GPUs annotated by presence (for ``sim_cli show``)."""
        with self._op(write=False) as st:
            for u, rec in st["gpus"].items():
                rec["absent"] = self._minor_by_uuid.get(u) in self._absent
            return st
