"""Prepare and unprepare claims: the node driver's state machine.

Every batch runs under a process-wide lock and a cross-process file lock, with
the checkpoint read fresh from disk. A claim that touches hardware (MIG, MPS,
time-slicing) is recorded as ``PrepareStarted`` with its intended placements
before anything changes, and ``PrepareCompleted`` once its CDI spec is verified;
a failure at any step rolls back what was done, so nothing half-made survives.
A claim that only needs a CDI spec (an exclusive whole GPU) skips the first
record: a crash there leaves at most a spec file, which start-up removes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from gpuplane.driver.api import configs
from gpuplane.driver.host import file_lock
from gpuplane.driver.hw import interface as hw
from gpuplane.driver.kube import NotFound
from gpuplane.driver.prepare import cdi, planning
from gpuplane.driver.prepare.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    DeviceRecord,
    MigRecord,
)
from gpuplane.driver.prepare.claims import AllocatedDevice, ClaimError, parse_allocation
from gpuplane.driver.prepare.contract import ClaimRef, PreparedDevice, PrepareResult, UnprepareResult
from gpuplane.driver.publish.inventory import GpuEntry, Inventory, MigSlot, discover
from gpuplane.driver.sharing.mps import MpsControl
from gpuplane.driver.sharing.mps_spec import MpsError, MpsSpec

log = structlog.get_logger(__name__)

MPS_CONTAINER_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    def list_claims(self) -> list[dict[str, Any]]: ...

    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None: ...


class Observer(Protocol):
    """Metrics hook: the state reports what happened, metrics decide how to count it."""

    def prepared(self, kind: str, seconds: float) -> None: ...

    def failed(self, op: str, reason: str) -> None: ...

    def hardware_changed(self, mig_instances: int, mps_daemons: int, devices_prepared: int) -> None: ...


class _NullObserver:
    def prepared(self, kind: str, seconds: float) -> None:
        pass

    def failed(self, op: str, reason: str) -> None:
        pass

    def hardware_changed(self, mig_instances: int, mps_daemons: int, devices_prepared: int) -> None:
        pass


@dataclass
class StateSettings:
    node_name: str
    driver_name: str
    cdi_root: Path
    checkpoint_path: Path
    lock_path: Path
    boot_id: str
    dev_root: Path = Path("/dev")
    check_host_device_nodes: bool = False


def _reason(exc: BaseException) -> str:
    if isinstance(exc, hw.HardwareError):
        return f"hardware-{exc.code.value}"
    return type(exc).__name__


class DeviceState:
    """Implements ``ClaimPreparer`` for the gRPC layer."""

    def __init__(
        self,
        settings: StateSettings,
        backend: hw.GpuBackend,
        claims: ClaimSource,
        mps: MpsControl,
        *,
        observer: Observer | None = None,
        fault_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.claims = claims
        self.mps = mps
        self.observer: Observer = observer or _NullObserver()
        # Called with a step name after every durable step; crash tests kill the process there.
        self._step: Callable[[str], None] = fault_hook or (lambda _step: None)
        self.store = CheckpointStore(settings.checkpoint_path, settings.boot_id)
        self._lock = threading.Lock()
        self._inventory: Inventory | None = None
        self.on_inventory_change: Callable[[Inventory], None] | None = None

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def _locked(self) -> Any:
        with self._lock, file_lock(self.settings.lock_path):
            yield

    # ---------------------------------------------------------------- inventory
    def inventory(self) -> Inventory:
        if self._inventory is None:
            with self._locked():
                self._refresh(self.store.load().checkpoint)
        assert self._inventory is not None
        return self._inventory

    def _refresh(self, cp: Checkpoint, also_owned: Iterable[tuple[str, int]] = ()) -> Inventory:
        owned = [
            (d.mig.parent_uuid, d.mig.gi_id)
            for rec in cp.claims.values()
            for d in rec.devices
            if d.mig is not None and d.mig.gi_id is not None and d.mig.created_by_driver
        ]
        inv = discover(self.settings.node_name, self.backend, [*owned, *also_owned])
        changed = self._inventory is None or _published_view(inv) != _published_view(self._inventory)
        self._inventory = inv
        if changed and self.on_inventory_change is not None:
            self.on_inventory_change(inv)
        return inv

    def rediscover(self) -> Inventory:
        """Re-read the hardware (periodic republish); returns the fresh inventory."""
        with self._locked():
            return self._refresh(self.store.load().checkpoint)

    # ------------------------------------------------------------------ prepare
    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        with self._locked():
            cp = self.store.load().checkpoint
            for ref in claims:
                log_ = log.bind(claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
                start = time.perf_counter()
                try:
                    result = self._prepare_one(cp, ref)
                except (
                    ClaimError,
                    configs.ConfigError,
                    hw.HardwareError,
                    MpsError,
                    cdi.CdiError,
                    NotFound,
                ) as exc:
                    self.observer.failed("prepare", _reason(exc))
                    log_.warning("prepare failed", error=str(exc))
                    result = PrepareResult(error=str(exc))
                except Exception as exc:
                    self.observer.failed("prepare", "internal")
                    log_.exception("prepare failed unexpectedly")
                    result = PrepareResult(error=f"internal error preparing claim: {exc}; the driver log has details")
                else:
                    kind = _claim_kind(cp.claims.get(ref.uid))
                    self.observer.prepared(kind, time.perf_counter() - start)
                results[ref.uid] = result
            self._report_hardware(cp)
        return results

    def _prepare_one(self, cp: Checkpoint, ref: ClaimRef) -> PrepareResult:
        rec = cp.claims.get(ref.uid)
        if rec is not None and rec.phase == "PrepareCompleted":
            if rec.cdi_spec is None or not Path(rec.cdi_spec).exists():
                self._write_cdi(rec)  # the spec vanished (e.g. /var/run is tmpfs): rebuild it
                self.store.save(cp)
            return _result_from(rec)
        if rec is not None:
            log.info("rolling back a half-done prepare before redoing it", uid=ref.uid)
            self._undo(cp, rec)
        obj = self.claims.get_claim(ref.namespace, ref.name)
        alloc = parse_allocation(obj, ref.uid, self.settings.driver_name, self.settings.node_name)
        try:
            plan = planning.plan_claim(
                self._inventory or self._refresh(cp),
                cp.claims,
                alloc,
                self.settings.node_name,
                self.settings.driver_name,
            )
        except (ClaimError, configs.ConfigError) as exc:
            self.claims.claim_event(obj, "PrepareFailed", str(exc))
            raise
        rec = ClaimRecord(
            uid=alloc.uid,
            namespace=alloc.namespace,
            name=alloc.name,
            phase="PrepareStarted",
            devices=[_device_record(a, g, s) for a, g, s in plan.devices],
            sharing=plan.sharing,
        )
        touches_hardware = plan.sharing.strategy != "Exclusive" or any(s is not None for _, _, s in plan.devices)
        cp.claims[rec.uid] = rec
        if touches_hardware:
            self.store.save(cp)
            self._step("prepare:started-recorded")
        try:
            self._execute(cp, rec, plan)
            self._write_cdi(rec)
            self._step("prepare:cdi-written")
        except Exception as exc:
            log.warning("prepare step failed; rolling back", uid=rec.uid, error=str(exc))
            self._undo(cp, rec)
            if isinstance(exc, (hw.HardwareError, MpsError)):
                self.claims.claim_event(obj, "PrepareFailed", str(exc))
            raise
        rec.phase = "PrepareCompleted"
        rec.updated_at = time.time()
        self.store.save(cp)
        self._step("prepare:completed-recorded")
        return _result_from(rec)

    def _execute(self, cp: Checkpoint, rec: ClaimRecord, plan: planning.Plan) -> None:
        for dev_rec, (_, gpu, slot) in zip(rec.devices, plan.devices, strict=True):
            if slot is not None and dev_rec.mig is not None:
                self._create_mig(cp, rec, dev_rec, gpu, slot)
            elif slot is None:
                self._leave_mig_mode(gpu)
        if rec.sharing.strategy == "TimeSlicing" and rec.sharing.timeslice_interval:
            for dev_rec in rec.devices:
                self.backend.set_timeslice(dev_rec.gpu_uuid, rec.sharing.timeslice_interval)
        if rec.sharing.strategy == "MPS":
            uuids = tuple(_runtime_uuid(d) for d in rec.devices)
            limits = {
                _runtime_uuid(d): rec.sharing.mps_pinned_limits[key]
                for d in rec.devices
                if (key := planning.limit_key(d.gpu_uuid, d.mig.start if d.mig else None))
                in rec.sharing.mps_pinned_limits
            }
            rec.mps_daemon = True
            self.store.save(cp)
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

    def _leave_mig_mode(self, gpu: GpuEntry) -> None:
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

    def _create_mig(
        self, cp: Checkpoint, rec: ClaimRecord, dev_rec: DeviceRecord, gpu: GpuEntry, slot: MigSlot
    ) -> None:
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
        mode = self.backend.mig_mode(uuid)
        if not mode.current:
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
            mode = self.backend.set_mig_mode(uuid, True)
            if not mode.current:
                with contextlib.suppress(hw.HardwareError):
                    self.backend.set_mig_mode(uuid, False)  # withdraw the pending request
                raise needs_reset
        owned = _owned_instances(cp, exclude=rec.uid)
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
        self.store.save(cp)
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

    def _read_caps(self, d: DeviceRecord) -> tuple[int | None, int | None]:
        """Caps minors of a MIG instance recorded before they were kept in the checkpoint."""
        assert d.mig is not None
        gi = next((g for g in self._instances_or_empty(d.mig.parent_uuid) if g.gi_id == d.mig.gi_id), None)
        if gi is None or gi.mig_uuid != d.mig.mig_uuid:
            raise ClaimError(
                f"MIG instance {d.mig.gi_id} of device {d.device} on GPU {d.mig.parent_uuid} is gone "
                "(GPU reset?); delete the pod so the claim is allocated and prepared again"
            )
        d.mig.gi_caps_minor, d.mig.ci_caps_minor = gi.gi_caps_minor, gi.ci_caps_minor
        return gi.gi_caps_minor, gi.ci_caps_minor

    def _write_cdi(self, rec: ClaimRecord) -> None:
        dev = self.settings.dev_root
        edits: list[cdi.DeviceEdits] = []
        for d in rec.devices:
            nodes = [str(dev / f"nvidia{d.gpu_minor}")]
            env = [f"GPUPLANE_DEVICE_{d.device.upper().replace('-', '_')}_UUID={_runtime_uuid(d)}"]
            if d.mig is not None and d.mig.gi_id is not None:
                known = d.mig.gi_caps_minor is not None or d.mig.ci_caps_minor is not None
                gi_cap, ci_cap = (d.mig.gi_caps_minor, d.mig.ci_caps_minor) if known else self._read_caps(d)
                nodes.extend(str(dev / "nvidia-caps" / f"nvidia-cap{m}") for m in (gi_cap, ci_cap) if m is not None)
            edits.append(cdi.DeviceEdits(device_name=d.device, device_nodes=tuple(nodes), env=tuple(env)))
        uuids = ",".join(_runtime_uuid(d) for d in rec.devices)
        common_env = [
            f"NVIDIA_VISIBLE_DEVICES={uuids}",
            f"CUDA_VISIBLE_DEVICES={uuids}",
            f"GPUPLANE_CLAIM_UID={rec.uid}",
        ]
        common_mounts: list[cdi.Mount] = []
        if rec.mps_daemon:
            daemon = next((d for d in self.mps.list_daemons() if d.claim_uid == rec.uid), None)
            if daemon is None:
                raise MpsError(f"MPS daemon for claim {rec.uid} is not running")
            common_env.extend(f"{k}={v}" for k, v in sorted(daemon.container_env().items()))
            common_mounts.extend(
                cdi.Mount(host_path=str(m.host_path), container_path=str(m.container_path), options=tuple(m.options))
                for m in daemon.container_mounts()
            )
        made = [
            f"{d.mig.parent_uuid}/{d.mig.gi_id}"
            for d in rec.devices
            if d.mig is not None and d.mig.gi_id is not None and d.mig.created_by_driver
        ]
        spec = cdi.ClaimSpec(
            annotations=((cdi.MIG_OWNERSHIP_ANNOTATION, ",".join(made)),) if made else (),
            claim_uid=rec.uid,
            devices=tuple(edits),
            common_env=tuple(common_env),
            common_device_nodes=tuple(str(dev / n) for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")),
            common_mounts=tuple(common_mounts),
        )
        path, ids = cdi.write_spec(self.settings.cdi_root, spec, self.settings.check_host_device_nodes)
        rec.cdi_spec = str(path)
        for d in rec.devices:
            d.cdi_ids = [ids[d.device]]

    # ---------------------------------------------------------------- unprepare
    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        results: dict[str, UnprepareResult] = {}
        with self._locked():
            cp = self.store.load().checkpoint
            for ref in claims:
                try:
                    rec = cp.claims.get(ref.uid)
                    if rec is not None:
                        self._undo(cp, rec)
                    else:
                        cdi.remove_spec(self.settings.cdi_root, ref.uid)
                    results[ref.uid] = UnprepareResult()
                except Exception as exc:
                    self.observer.failed("unprepare", _reason(exc))
                    log.exception("unprepare failed", uid=ref.uid)
                    results[ref.uid] = UnprepareResult(
                        error=f"unprepare failed: {exc}; kubelet retries, the driver log has details"
                    )
            self._report_hardware(cp)
        return results

    def _undo(self, cp: Checkpoint, rec: ClaimRecord) -> None:
        """Remove everything a (possibly half-done) prepare made, in reverse order. Idempotent."""
        cdi.remove_spec(self.settings.cdi_root, rec.uid)
        self._step("undo:cdi-removed")
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
        owned_elsewhere = _owned_instances(cp, exclude=rec.uid)
        for d in reversed(rec.devices):
            if d.mig is None or not d.mig.created_by_driver:
                continue
            self._destroy_mig(d.mig, owned_elsewhere)
        cp.claims.pop(rec.uid, None)
        self.store.save(cp)
        self._step("undo:record-removed")

    def _destroy_mig(self, mig: MigRecord, owned_elsewhere: set[tuple[str, int]]) -> None:
        instances = {gi.gi_id: gi for gi in self._instances_or_empty(mig.parent_uuid)}
        gi = instances.get(mig.gi_id) if mig.gi_id is not None else None
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
            return
        for ci in gi.compute_instances:
            with _ignore_gone():
                self.backend.destroy_compute_instance(mig.parent_uuid, gi.gi_id, ci.ci_id)
            self._step("undo:ci-destroyed")
        with _ignore_gone():
            self.backend.destroy_gpu_instance(mig.parent_uuid, gi.gi_id)
        self._step("undo:gi-destroyed")

    def _instances_or_empty(self, uuid: str) -> Sequence[hw.GpuInstance]:
        try:
            if not self.backend.mig_mode(uuid).current:
                return ()
            return self.backend.gpu_instances(uuid)
        except hw.HardwareError as exc:
            if exc.code in (hw.ErrorCode.NOT_FOUND, hw.ErrorCode.GPU_IS_LOST):
                return ()
            raise

    # ----------------------------------------------------------------- recovery
    def recover(self) -> dict[str, int]:
        """At start-up: roll back half-done claims, drop what no completed claim owns."""
        with self._locked():
            loaded = self.store.load()
            cp = loaded.checkpoint
            stats = {"rolled_back": 0, "rebuilt": 0, "cdi_removed": 0, "mps_stopped": 0}
            for rec in [r for r in cp.claims.values() if r.phase == "PrepareStarted"]:
                self._undo(cp, rec)
                stats["rolled_back"] += 1
            if loaded.corrupt:
                stats["rebuilt"] = self._rebuild_from_api(cp)
            stats.update(self._sweep(cp))
            self.store.save(cp)
            self._refresh(cp)
            self._report_hardware(cp)
        log.info("recovery finished", **stats)
        return stats

    def _sweep(self, cp: Checkpoint) -> dict[str, int]:
        completed = {uid for uid, r in cp.claims.items() if r.phase == "PrepareCompleted"}
        removed = 0
        for uid in cdi.list_claim_specs(self.settings.cdi_root):
            if uid not in completed:
                cdi.remove_spec(self.settings.cdi_root, uid)
                removed += 1
        keep = {uid for uid, r in cp.claims.items() if r.mps_daemon}
        stopped = self.mps.cleanup_orphans(keep)
        return {"cdi_removed": removed, "mps_stopped": len(stopped)}

    def _rebuild_from_api(self, cp: Checkpoint) -> int:
        """After a corrupt checkpoint: re-prepare claims that were prepared here (their CDI spec exists)."""
        specs = cdi.list_claim_specs(self.settings.cdi_root)
        # The specs name the MIG instances the driver made: they are the driver's, not an admin's.
        self._refresh(cp, {pair for path in specs.values() for pair in cdi.driver_mig_instances(path)})
        rebuilt = 0
        for obj in self.claims.list_claims():
            meta = obj.get("metadata", {})
            uid = meta.get("uid", "")
            results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            ours = [
                r
                for r in results
                if r.get("driver") == self.settings.driver_name and r.get("pool") == self.settings.node_name
            ]
            if not ours or uid not in specs:
                continue
            try:
                self._prepare_one(cp, ClaimRef(namespace=meta.get("namespace", ""), uid=uid, name=meta.get("name", "")))
                rebuilt += 1
            except Exception as exc:
                log.warning("could not rebuild claim from the API", uid=uid, error=str(exc))
        return rebuilt

    def cleanup(self) -> dict[str, int]:
        """Periodic: unprepare checkpointed claims whose ResourceClaim is gone or replaced."""
        stale: list[ClaimRef] = []
        with self._locked():
            cp = self.store.load().checkpoint
            records = list(cp.claims.values())
        for rec in records:
            try:
                obj = self.claims.get_claim(rec.namespace, rec.name)
            except NotFound:
                stale.append(ClaimRef(rec.namespace, rec.uid, rec.name))
                continue
            except Exception as exc:
                log.warning("cleanup could not read claim", uid=rec.uid, error=str(exc))
                continue
            if obj.get("metadata", {}).get("uid") != rec.uid:
                stale.append(ClaimRef(rec.namespace, rec.uid, rec.name))
        if stale:
            log.info("unpreparing claims whose ResourceClaim is gone", claims=[r.uid for r in stale])
            self.unprepare(stale)
        with self._locked():
            cp = self.store.load().checkpoint
            stats = self._sweep(cp)
        stats["stale_unprepared"] = len(stale)
        return stats

    def _report_hardware(self, cp: Checkpoint) -> None:
        mig = sum(1 for r in cp.claims.values() for d in r.devices if d.mig is not None and d.mig.gi_id is not None)
        mps = sum(1 for r in cp.claims.values() if r.mps_daemon)
        prepared = sum(len(r.devices) for r in cp.claims.values() if r.phase == "PrepareCompleted")
        self.observer.hardware_changed(mig, mps, prepared)

    def snapshot(self) -> Checkpoint:
        with self._locked():
            return self.store.load().checkpoint


# ----------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _ignore_gone() -> Any:
    try:
        yield
    except hw.HardwareError as exc:
        if exc.code not in (hw.ErrorCode.NOT_FOUND, hw.ErrorCode.INVALID_ARGUMENT, hw.ErrorCode.GPU_IS_LOST):
            raise


def _owned_instances(cp: Checkpoint, exclude: str) -> set[tuple[str, int]]:
    return {
        (d.mig.parent_uuid, d.mig.gi_id)
        for r in cp.claims.values()
        if r.uid != exclude
        for d in r.devices
        if d.mig is not None and d.mig.gi_id is not None
    }


def _device_record(dev: AllocatedDevice, gpu: GpuEntry, slot: MigSlot | None) -> DeviceRecord:
    mig = None
    if slot is not None:
        mig = MigRecord(
            parent_uuid=gpu.info.uuid,
            profile_id=slot.profile.profile_id,
            profile_name=slot.profile.name,
            start=slot.start,
            size=slot.profile.memory_slices,
        )
    return DeviceRecord(
        request_names=[dev.request],
        pool=dev.pool,
        device=dev.device,
        kind="mig" if slot is not None else "gpu",
        gpu_uuid=gpu.info.uuid,
        gpu_minor=gpu.info.minor,
        mig=mig,
        share_id=dev.share_id,
    )


def _runtime_uuid(d: DeviceRecord) -> str:
    if d.mig is not None and d.mig.mig_uuid:
        return d.mig.mig_uuid
    return d.gpu_uuid


def _result_from(rec: ClaimRecord) -> PrepareResult:
    return PrepareResult(
        devices=tuple(
            PreparedDevice(
                request_names=tuple(d.request_names),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=tuple(d.cdi_ids),
                share_id=d.share_id,
            )
            for d in rec.devices
        )
    )


def _claim_kind(rec: ClaimRecord | None) -> str:
    if rec is None:
        return "unknown"
    if rec.sharing.strategy == "MPS":
        return "mps"
    if any(d.kind == "mig" for d in rec.devices):
        return "mig"
    return "gpu"


def _published_view(inv: Inventory) -> tuple[Any, ...]:
    return tuple(
        (g.name, g.nvlink_domain, g.offer_whole, g.offer_dynamic_mig, tuple(s.name for s in g.mig_slots))
        for g in inv.gpus
    )
