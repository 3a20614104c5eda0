"""What only a simulator can do: reset a GPU, bring a lost one back, reboot, inject health events, processes, telemetry.

Tests, the e2e harness and :mod:`gpuplane.driver.hw.sim_cli` drive these; the production interface
(:class:`~gpuplane.driver.hw.interface.GpuBackend`) does not have them. Each changes the state file
(:mod:`gpuplane.driver.hw.sim_store`), which the driver sees on its next call, as it would see
hardware change.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from gpuplane.driver.hw.interface import ErrorCode, HealthEvent, HealthEventKind, MigMode
from gpuplane.driver.hw.sim_store import SimStore, err

# NVML clocks-event reasons (nvmlClocksEventReason*).
THROTTLE_GPU_IDLE = 0x1
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80

XID_FALLEN_OFF_BUS = 79

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


class SimControls(SimStore):
    """The simulator-only controls (a part of :class:`~gpuplane.driver.hw.sim.Simulator`)."""

    def timeslice(self, uuid: str) -> str:
        """The stored time-slice interval class."""
        with self._op(write=False) as st:
            return str(self._gpu(st, uuid)["timeslice"])

    def uuid_of_minor(self, minor: int) -> str:
        return self._uuid_by_minor[minor]

    def reset_gpu(self, uuid: str) -> MigMode:
        """Simulated GPU reset: applies a pending MIG mode, wipes MIG instances, clears a lost state.

        Refused with IN_USE while processes run (as ``nvidia-smi -r`` is).
        """
        with self._op(write=True) as st:
            rec = self._gpu(st, uuid, allow_lost=True)
            if rec["processes"]:
                raise err(ErrorCode.IN_USE, f"GPU {uuid}: cannot reset with processes running")
            rec["mig_current"] = rec["mig_pending"]
            rec["gis"] = []
            rec["lost"] = False
            rec["throttle"] = 0
            rec["timeslice"] = "Default"
            return MigMode(current=rec["mig_current"], pending=rec["mig_pending"])

    def back_on_bus(self, uuid: str) -> None:
        """A GPU that fell off the bus answers again without a reset (the link recovered): its MIG instances
        are still there, as is everything else it held."""
        with self._op(write=True) as st:
            self._gpu(st, uuid, allow_lost=True)["lost"] = False

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
                    raise err(ErrorCode.INVALID_ARGUMENT, f"unknown telemetry key {key!r}")
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
