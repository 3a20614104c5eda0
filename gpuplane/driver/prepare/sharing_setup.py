"""The sharing step of a prepare and of its undo: a claim's MPS daemon, or its GPUs' time-slice.

Side effects:

- :meth:`ClaimSharing.setup`, for ``TimeSlicing``: sets the time-slice of every GPU of the claim
  through the backend (``nvidia-smi compute-policy`` on NVML) to the highest tier's interval among
  the time-sliced claims on it (:mod:`gpuplane.driver.sharing.timeslice_tiers`). For ``MPS``:
  records ``mps_daemon`` in the checkpoint first (``save``), then starts the claim's daemon with
  its thread percentage, pinned-memory limits and client priority (:class:`~gpuplane.driver.sharing.mps.MpsControl`:
  directories, a process, its settings read back).
- :meth:`ClaimSharing.undo`: stops the claim's daemon and removes its directories; sets each GPU's
  time-slice to the interval of the time-sliced claims still on it (``Default`` when none is left).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.prepare import planning
from gpuplane.driver.prepare.cdi_assembly import runtime_uuid
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord
from gpuplane.driver.sharing import timeslice_tiers
from gpuplane.driver.sharing.mps import MpsControl
from gpuplane.driver.sharing.mps_spec import MpsSpec


class ClaimSharing:
    """MPS daemons and time-slices of claims, on one backend and one MPS control."""

    def __init__(self, backend: hw.GpuBackend, mps: MpsControl, step: Callable[[str], None]) -> None:
        self.backend = backend
        self.mps = mps
        self._step = step

    def setup(self, cp: Checkpoint, rec: ClaimRecord, save: Callable[[], None]) -> None:
        """Set up what ``rec.sharing`` asks for (nothing for ``Exclusive``); ``cp`` holds the GPUs' other claims."""
        if rec.sharing.strategy == "TimeSlicing":
            for dev_rec in rec.devices:  # the highest tier's interval (gpuplane.driver.sharing.timeslice_tiers)
                others = timesliced_on(cp.claims, dev_rec.gpu_uuid, exclude=rec.uid)
                interval = timeslice_tiers.gpu_interval([rec.sharing.timeslice_interval, *others])
                self.backend.set_timeslice(dev_rec.gpu_uuid, interval)
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
                    client_priority=rec.sharing.mps_client_priority,
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
                # The next tier's interval once this claim leaves; Default when no time-sliced claim is left.
                remaining = timeslice_tiers.gpu_interval(timesliced_on(cp.claims, d.gpu_uuid, exclude=rec.uid))
                with contextlib.suppress(hw.HardwareError):
                    self.backend.set_timeslice(d.gpu_uuid, remaining)


def timesliced_on(claims: Mapping[str, ClaimRecord], gpu_uuid: str, *, exclude: str) -> list[str | None]:
    """The intervals of the other time-sliced claims on one GPU."""
    return [
        o.sharing.timeslice_interval
        for o in claims.values()
        if o.uid != exclude
        and o.sharing.strategy == "TimeSlicing"
        and any(x.gpu_uuid == gpu_uuid and x.kind == "gpu" for x in o.devices)
    ]
