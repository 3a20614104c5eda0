"""The simulator's state, kept like hardware state: one JSON file per node, read fresh on every call.

MIG mode, GPU/compute instances, time-slice settings, injected processes, pending health events
and telemetry overrides live in ``<state_dir>/sim-state.json``. Every operation
(:meth:`SimStore._op`) re-reads that file under a file lock on ``<state_dir>/sim-state.lock``
(shared for reads, exclusive for writes) and writes it back atomically, so MIG instances survive
a SIGKILL of the driver, and another process (a test, :mod:`gpuplane.driver.hw.sim_cli`) can change
the state while the driver runs. After every write the placeholder device nodes under
``<state_dir>/dev`` (:mod:`gpuplane.driver.hw.sim_devnodes`) are made to match it. Side effects:
that file, its lock and those nodes.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from typing import Any

from gpuplane.driver.host import atomic_write, file_lock
from gpuplane.driver.hw import caps, sim_devnodes, sim_profiles
from gpuplane.driver.hw.interface import ErrorCode, HardwareError
from gpuplane.driver.hw.sim_config import SimConfig, gpu_uuid

STATE_FILE = "sim-state.json"
LOCK_FILE = "sim-state.lock"
STATE_VERSION = 1


def err(code: ErrorCode, msg: str) -> HardwareError:
    return HardwareError(code, msg)


class SimStore:
    """The state file of one simulated node, and the frame every simulated call runs in."""

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
        self._devnodes = sim_devnodes.DeviceNodes(config.state_dir / "dev")
        self.proc_devices = config.state_dir / "proc" / "devices"
        """The simulated node's ``/proc/devices`` (written when the state is first written)."""

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
                raise err(ErrorCode.UNKNOWN, f"simulator state {self._state_path} is corrupt: {e}") from e
            if not isinstance(st, dict) or st.get("version") != STATE_VERSION:
                raise err(ErrorCode.UNKNOWN, f"simulator state {self._state_path}: unsupported version")
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
                self._devnodes.sync(self._wanted_nodes(st))
                if not self.proc_devices.exists():
                    self.proc_devices.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write(self.proc_devices, sim_devnodes.proc_devices_text().encode(), 0o444, durable=False)

    def _wanted_nodes(self, st: dict[str, Any]) -> dict[str, tuple[int, int]]:
        """The device nodes a real driver would have made for this state: GPUs present, MIG caps of instances."""
        minors: list[int] = []
        for rec in st["gpus"].values():
            if rec["minor"] in self._absent or not rec["mig_current"]:
                continue
            for gi in rec["gis"]:
                minors.append(caps.caps_minors(rec["minor"], gi["gi_id"], None)[0])
                for ci in gi["cis"]:
                    ci_minor = caps.caps_minors(rec["minor"], gi["gi_id"], ci["ci_id"])[1]
                    minors += [] if ci_minor is None else [ci_minor]
        present = [m for m in range(self.profile.gpu_count) if m not in self._absent]
        return sim_devnodes.wanted_nodes(present, minors)

    @contextlib.contextmanager
    def _op(self, *, write: bool, latency: bool = False) -> Iterator[dict[str, Any]]:
        """One simulated NVML call: serialized, timed, on freshly read state."""
        t0 = time.monotonic()
        with self._lock:
            try:
                if not self._initialized:
                    raise err(ErrorCode.UNINITIALIZED, "simulator not initialized (call init())")
                if latency and self.config.op_latency_s > 0:
                    time.sleep(self.config.op_latency_s)
                with self._locked_state(write=write) as st:
                    yield st
            finally:
                self.sim_time_s += time.monotonic() - t0

    def _gpu(self, st: dict[str, Any], uuid: str, *, allow_lost: bool = False) -> dict[str, Any]:
        minor = self._minor_by_uuid.get(uuid)
        if minor is None or minor in self._absent:
            raise err(ErrorCode.NOT_FOUND, f"no GPU with uuid {uuid}")
        rec: dict[str, Any] = st["gpus"][uuid]
        if rec["lost"] and not allow_lost:
            raise err(ErrorCode.GPU_IS_LOST, f"GPU {uuid} has fallen off the bus")
        return rec
