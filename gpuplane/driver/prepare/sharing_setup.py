"""The sharing step of a prepare and of its undo: a claim's MPS daemon, or its GPUs' time-slice.

Side effects:

- :meth:`ClaimSharing.setup`, for ``TimeSlicing`` with an interval: sets the time-slice of every
  GPU of the claim through the backend (``nvidia-smi compute-policy`` on NVML). For ``MPS``:
  records ``mps_daemon`` in the checkpoint first (``save``), then starts the claim's daemon with
  its thread percentage and pinned-memory limits (:class:`~gpuplane.driver.sharing.mps.MpsControl`:
  directories, a process, its settings read back).
- :meth:`ClaimSharing.undo`: stops the claim's daemon and removes its directories; puts each GPU's
  time-slice back to ``Default`` unless another time-sliced claim still uses that GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.prepare import planning
from gpuplane.driver.prepare.cdi_assembly import runtime_uuid
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord
from gpuplane.driver.sharing.mps import MpsControl
from gpuplane.driver.sharing.mps_spec import MpsSpec


class ClaimSharing:
    """MPS daemons and time-slices of claims, on one backend and one MPS control."""

    def __init__(self, backend: hw.GpuBackend, mps: MpsControl, step: Callable[[str], None]) -> None:
        self.backend = backend
        self.mps = mps
        self._step = step

    def setup(self, rec: ClaimRecord, save: Callable[[], None]) -> None:
        """Set up what ``rec.sharing`` asks for (nothing for ``Exclusive``)."""
        if rec.sharing.strategy == "TimeSlicing" and rec.sharing.timeslice_interval:
            for dev_rec in rec.devices:
                self.backend.set_timeslice(dev_rec.gpu_uuid, rec.sharing.timeslice_interval)
        if rec.sharing.strategy == "MPS":
            uuids = tuple(runtime_uuid(d) for d in rec.devices)
            limits = {
                runtime_uuid(d): rec.sharing.mps_pinned_limits[key]
                for d in rec.devices
                if (key := planning.limit_key(d.gpu_uuid, d.mig.start if d.mig else None))
                in rec.sharing.mps_pinned_limits
            }
            rec.mps_daemon = True
            save()
            self._step("prepare:mps-recorded")
            self.mps.start(
                MpsSpec(
                    claim_uid=rec.uid,
                    device_uuids=uuids,
                    active_thread_percentage=rec.sharing.mps_active_thread_percentage,
                    pinned_memory_limits=limits,
                )
            )
            self._step("prepare:mps-started")

    def undo(self, cp: Checkpoint, rec: ClaimRecord) -> None:
        """Stop the claim's daemon and release its time-slices; idempotent."""
        # alive() scans /proc: only a claim that asked for MPS can have a daemon (recorded before it starts).
        if rec.mps_daemon or (rec.sharing.strategy == "MPS" and self.mps.alive(rec.uid)):
            self.mps.stop(rec.uid)
            self._step("undo:mps-stopped")
        if rec.sharing.strategy == "TimeSlicing":
            for d in rec.devices:
                still_shared = any(
                    o.uid != rec.uid
                    and o.sharing.strategy == "TimeSlicing"
                    and any(x.gpu_uuid == d.gpu_uuid for x in o.devices)
                    for o in cp.claims.values()
                )
                if not still_shared:
                    with contextlib.suppress(hw.HardwareError):
                        self.backend.set_timeslice(d.gpu_uuid, "Default")
