"""The MIG steps of a prepare and of its undo: MIG mode, GPU and compute instances, on the hardware backend.

Side effects (all through :class:`~gpuplane.driver.hw.interface.GpuBackend`):

- :meth:`MigOps.create` may turn MIG mode on (only on an idle GPU whose toggle needs no reset;
  a refused toggle is withdrawn), creates the claim's GPU instance at its placement (or adopts
  the one its own interrupted attempt left), saves the checkpoint once the GI id is known (so a
  crash rolls back by id), then creates the compute instance. An administrator's instance
  (``static_instance``) is used as it is: nothing is created.
- :meth:`MigOps.leave_mig_mode` turns MIG mode off on a GPU a whole-GPU claim gets, when no
  instance is left there; otherwise it refuses the claim and changes nothing.
- :meth:`MigOps.destroy` destroys the compute instances and the GPU instance a claim made,
  never one another claim owns; instances already gone are not an error. A GPU that does not
  answer (fell off the bus) is not "gone": destroy says so, and the caller records the instance
  as owed (:mod:`.owed`).

The driver never resets a GPU. ``step`` is called with a step name after each durable step
(crash tests kill the process there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.inventory import GpuEntry, MigSlot
from gpuplane.driver.prepare.checkpoint import Checkpoint, DeviceRecord, MigRecord
from gpuplane.driver.prepare.claims import ClaimError

Owned = set[tuple[str, int]]  # (parent GPU uuid, GI id)
GPU_AWAY = (hw.ErrorCode.GPU_IS_LOST, hw.ErrorCode.NOT_FOUND)  # the GPU itself does not answer


class MigOps:
    """MIG steps on one backend."""

    def __init__(self, backend: hw.GpuBackend, step: Callable[[str], None]) -> None:
        self.backend = backend
        self._step = step

    def leave_mig_mode(self, gpu: GpuEntry) -> None:
        """A whole GPU runs no CUDA work in MIG mode: turn off what earlier MIG claims left on."""
        uuid = gpu.info.uuid
        if not gpu.info.mig_capable or not self.backend.mig_mode(uuid).current:
            return
        if self.backend.gpu_instances(uuid):
            raise ClaimError(
                f"device {gpu.name} cannot be used whole: MIG instances exist on the GPU; "
                "delete the pod so the claim is allocated again"
            )
        if gpu.info.mig_toggle_needs_reset or self.backend.set_mig_mode(uuid, False).current:
            raise ClaimError(
                f"GPU {gpu.name} ({uuid}) is in MIG mode and needs a reset to leave it; the driver never resets "
                "a GPU. Disable MIG out of band (nvidia-smi -i <gpu> -mig 0, then reset) and retry"
            )

    def create(
        self, dev_rec: DeviceRecord, gpu: GpuEntry, slot: MigSlot, owned: Owned, save: Callable[[], None]
    ) -> None:
        """Make (or adopt) the instance ``dev_rec`` intends; ``owned`` are the instances other claims hold."""
        mig = dev_rec.mig
        assert mig is not None
        uuid = gpu.info.uuid
        if slot.static_instance is not None:
            mig.gi_id = slot.static_instance.gi_id
            mig.ci_id = (
                slot.static_instance.compute_instances[0].ci_id if slot.static_instance.compute_instances else None
            )
            mig.mig_uuid = slot.static_instance.mig_uuid
            mig.created_by_driver = False
            return
        self._enter_mig_mode(gpu)
        existing = next(
            (
                gi
                for gi in self.backend.gpu_instances(uuid)
                if gi.placement_start == slot.start and gi.profile_id == slot.profile.profile_id
            ),
            None,
        )
        if existing is not None and (uuid, existing.gi_id) not in owned:
            gi = existing  # left by this claim's own interrupted attempt or rebuilt state: adopt it
        else:
            try:
                gi = self.backend.create_gpu_instance(uuid, slot.profile.profile_id, slot.start)
            except hw.HardwareError as exc:
                if exc.code is hw.ErrorCode.INSUFFICIENT_RESOURCES:
                    raise ClaimError(
                        f"MIG placement {slot.profile.name}@{slot.start} on {gpu.name} is already taken "
                        f"({exc.message}); the claim must be re-allocated: delete and recreate the pod"
                    ) from exc
                if exc.code is hw.ErrorCode.NOT_SUPPORTED:
                    raise ClaimError(
                        f"MIG profile {slot.profile.name} is not supported on {gpu.name} ({gpu.info.product_name})"
                    ) from exc
                raise
            self._step("prepare:gi-created")
        mig.gi_id = gi.gi_id
        save()
        self._step("prepare:gi-recorded")
        if gi.mig_uuid is None or not gi.compute_instances:
            gi = self.backend.create_compute_instance(uuid, gi.gi_id)
            self._step("prepare:ci-created")
        mig.ci_id = gi.compute_instances[0].ci_id if gi.compute_instances else None
        mig.mig_uuid = gi.mig_uuid
        dev_rec.cdi_ids = []
        mig.gi_caps_minor, mig.ci_caps_minor = gi.gi_caps_minor, gi.ci_caps_minor
        # No save here: the ids above reach disk with the next record (next device or PrepareCompleted);
        # a crash before that rolls back by gi_id, which is on disk since prepare:gi-recorded.

    def _enter_mig_mode(self, gpu: GpuEntry) -> None:
        uuid = gpu.info.uuid
        if self.backend.mig_mode(uuid).current:
            return
        needs_reset = ClaimError(
            f"GPU {gpu.name} ({uuid}) needs a reset to enable MIG mode; the driver never resets a GPU. "
            "Enable MIG out of band (nvidia-smi -i <gpu> -mig 1, then reset) and retry"
        )
        if gpu.info.mig_toggle_needs_reset:
            raise needs_reset  # asking anyway would leave a pending MIG mode for the next reset
        busy = self.backend.processes(uuid)
        if busy:
            raise ClaimError(
                f"GPU {gpu.name} ({uuid}) has MIG mode off and {len(busy)} running process(es); "
                "enabling MIG would need an idle GPU. Stop the workloads on it or pick another GPU"
            )
        if not self.backend.set_mig_mode(uuid, True).current:
            with contextlib.suppress(hw.HardwareError):
                self.backend.set_mig_mode(uuid, False)  # withdraw the pending request
            raise needs_reset

    def read_caps(self, d: DeviceRecord) -> tuple[int | None, int | None]:
        """Caps minors of a MIG instance recorded before they were kept in the checkpoint (and keep them now)."""
        assert d.mig is not None
        gi = next((g for g in self.instances_or_empty(d.mig.parent_uuid) if g.gi_id == d.mig.gi_id), None)
        if gi is None or gi.mig_uuid != d.mig.mig_uuid:
            raise ClaimError(
                f"MIG instance {d.mig.gi_id} of device {d.device} on GPU {d.mig.parent_uuid} is gone "
                "(GPU reset?); delete the pod so the claim is allocated and prepared again"
            )
        d.mig.gi_caps_minor, d.mig.ci_caps_minor = gi.gi_caps_minor, gi.ci_caps_minor
        return gi.gi_caps_minor, gi.ci_caps_minor

    def destroy(self, mig: MigRecord, owned_elsewhere: Owned) -> bool:
        """Destroy the instance ``mig`` records (found by id, or by its intended placement before it had one).

        True when it is destroyed or was not there; False when its GPU does not answer (GPU_IS_LOST, or
        the GPU is not found): nothing more could be done, and the instance may still exist.
        """
        try:
            instances = {gi.gi_id: gi for gi in self._instances(mig.parent_uuid)}
        except hw.HardwareError as exc:
            if exc.code in GPU_AWAY:
                return False
            raise
        gi = instances.get(mig.gi_id) if mig.gi_id is not None else None
        if gi is not None and (gi.placement_start, gi.profile_id) != (mig.start, mig.profile_id):
            gi = None  # the id was reused after a reset: not the instance this record made
        if gi is None and mig.gi_id is None:
            # Intent recorded, id not yet: an instance at the intended placement that no
            # other claim owns can only be the one this claim was creating.
            gi = next(
                (
                    g
                    for g in instances.values()
                    if g.placement_start == mig.start
                    and g.profile_id == mig.profile_id
                    and (mig.parent_uuid, g.gi_id) not in owned_elsewhere
                ),
                None,
            )
        if gi is None or (mig.parent_uuid, gi.gi_id) in owned_elsewhere:
            return True
        try:
            for ci in gi.compute_instances:
                with _ignore_gone():
                    self.backend.destroy_compute_instance(mig.parent_uuid, gi.gi_id, ci.ci_id)
                self._step("undo:ci-destroyed")
            with _ignore_gone():
                self.backend.destroy_gpu_instance(mig.parent_uuid, gi.gi_id)
        except hw.HardwareError as exc:
            if exc.code is hw.ErrorCode.GPU_IS_LOST:
                return False  # fell off the bus half way: the GPU instance is still owed
            raise
        self._step("undo:gi-destroyed")
        return True

    def _instances(self, uuid: str) -> Sequence[hw.GpuInstance]:
        """The GPU's instances (none when MIG is off); raises when the GPU does not answer."""
        if not self.backend.mig_mode(uuid).current:
            return ()
        return self.backend.gpu_instances(uuid)

    def instances_or_empty(self, uuid: str) -> Sequence[hw.GpuInstance]:
        """The GPU's instances; none when MIG is off or the GPU is gone."""
        try:
            return self._instances(uuid)
        except hw.HardwareError as exc:
            if exc.code in GPU_AWAY:
                return ()
            raise


def owned_instances(cp: Checkpoint, exclude: str) -> Owned:
    """The MIG instances (by GI id) the checkpoint's claims other than ``exclude`` hold, and those owed."""
    held = {
        (d.mig.parent_uuid, d.mig.gi_id)
        for r in cp.claims.values()
        if r.uid != exclude
        for d in r.devices
        if d.mig is not None and d.mig.gi_id is not None
    }
    return held | {(o.parent_uuid, o.gi_id) for o in cp.owed_mig if o.gi_id is not None}


@contextlib.contextmanager
def _ignore_gone() -> Iterator[None]:
    try:
        yield
    except hw.HardwareError as exc:
        if exc.code not in (hw.ErrorCode.NOT_FOUND, hw.ErrorCode.INVALID_ARGUMENT):
            raise  # GPU_IS_LOST among them: the instance is not gone, its GPU stopped answering
