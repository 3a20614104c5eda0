"""Prepare and unprepare claims: the node driver's transaction.

Every batch runs under a process-wide lock and a cross-process file lock, with the checkpoint
read fresh from disk. A claim that touches hardware (MIG, MPS, time-slicing) is recorded as
``PrepareStarted`` with its intended placements before anything changes, and
``PrepareCompleted`` once its CDI spec is verified; a failure at any step rolls back what was
done, in reverse order, so nothing half-made survives. A claim that only needs a CDI spec (an
exclusive whole GPU) skips the first record: a crash there leaves at most a spec file, which
start-up removes.

:class:`DeviceState` is the transaction: the locks, the checkpoint and the order of the steps.
The steps are elsewhere, each module stating its side effects: MIG (:mod:`.mig_ops`), sharing
(:mod:`.sharing_setup`: the MPS daemon, time-slices), the CDI spec (:mod:`.cdi_assembly`
assembles it, :mod:`.cdi` writes it), and recovery at start-up and periodically
(:mod:`.recovery`).
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

from gpuplane.api import configs
from gpuplane.driver.host import file_lock
from gpuplane.driver.hw import interface as hw
from gpuplane.driver.inventory import GpuEntry, Inventory, MigSlot, discover
from gpuplane.driver.kube import NotFound
from gpuplane.driver.prepare import cdi, cdi_assembly, imex_claims, owed, planning, recovery
from gpuplane.driver.prepare.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    DeviceRecord,
    MigRecord,
)
from gpuplane.driver.prepare.claims import AllocatedDevice, ClaimError, parse_allocation
from gpuplane.driver.prepare.contract import ClaimRef, PreparedDevice, PrepareResult, UnprepareResult
from gpuplane.driver.prepare.mig_ops import MigOps, owned_instances
from gpuplane.driver.prepare.sharing_setup import ClaimSharing
from gpuplane.driver.sharing.mps import MpsControl
from gpuplane.driver.sharing.mps_spec import MpsError

log = structlog.get_logger(__name__)


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    def list_claims(self) -> list[dict[str, Any]]: ...

    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None: ...


class Observer(Protocol):
    """Metrics hook: the state reports what happened, metrics decide how to count it."""

    def prepared(self, kind: str, seconds: float) -> None: ...

    def failed(self, op: str, reason: str) -> None: ...

    def hardware_changed(self, mig_instances: int, mps_daemons: int, devices_prepared: int, mig_owed: int) -> None: ...


class _NullObserver:
    def prepared(self, kind: str, seconds: float) -> None:
        pass

    def failed(self, op: str, reason: str) -> None:
        pass

    def hardware_changed(self, mig_instances: int, mps_daemons: int, devices_prepared: int, mig_owed: int) -> None:
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
    mig_placements: bool = True  # False: publish whole GPUs only (see inventory.discover)


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
        self.mig = MigOps(backend, self._step)
        self.sharing = ClaimSharing(backend, mps, self._step)
        self._lock = threading.Lock()
        self._inventory: Inventory | None = None
        self.owing = False  # MIG instances are owed (gpuplane.driver.prepare.owed): publish only after a refresh
        self.on_inventory_change: Callable[[Inventory], None] | None = None
        # Called after every prepare/unprepare batch (the steered layout re-ranks what is prepared).
        self.on_claims_change: Callable[[], None] | None = None
        self.imex: imex_claims.Gate | imex_claims.NoImex = imex_claims.NoImex()  # a claim's IMEX channel, if any
        self.mig_offer: Callable[[], frozenset[str] | None] = lambda: None  # GPUs offered for MIG (None: all)
        self.recovery = recovery.Recovery(self, self.store, claims, settings, mps)

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def locked(self) -> Any:
        """The transaction's two locks: this process's, then the node's (flock on ``lock_path``)."""
        with self._lock, file_lock(self.settings.lock_path):
            yield

    # ---------------------------------------------------------------- inventory
    def inventory(self) -> Inventory:
        if self._inventory is None:
            with self.locked():
                self.refresh(self.store.load().checkpoint)
        assert self._inventory is not None
        return self._inventory

    def refresh(self, cp: Checkpoint, also_owned: Iterable[tuple[str, int]] = ()) -> Inventory:
        # Owed MIG instances first (destroyed where their GPU answers again): a GPU is offered only after.
        withheld = owed.settle(self.mig, cp, lambda: self.store.save(cp))
        self.owing = bool(cp.owed_mig)
        self.report_hardware(cp)  # settling may have dropped owed instances
        owned = [
            (d.mig.parent_uuid, d.mig.gi_id)
            for rec in cp.claims.values()
            for d in rec.devices
            if d.mig is not None and d.mig.gi_id is not None and d.mig.created_by_driver
        ] + [(o.parent_uuid, o.gi_id) for o in cp.owed_mig if o.gi_id is not None]
        owned += also_owned
        cfg = self.settings
        offer = self.mig_offer()
        inv = discover(cfg.node_name, self.backend, owned, withheld, mig_placements=cfg.mig_placements, mig_offer=offer)
        changed = self._inventory is None or inv.published_view() != self._inventory.published_view()
        self._inventory = inv
        if changed and self.on_inventory_change is not None:
            self.on_inventory_change(inv)
        return inv

    def rediscover(self) -> Inventory:
        """Re-read the hardware (periodic republish); returns the fresh inventory."""
        with self.locked():
            return self.refresh(self.store.load().checkpoint)

    # ------------------------------------------------------------------ prepare
    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        with self.locked():
            cp = self.store.load().checkpoint
            for ref in claims:
                log_ = log.bind(claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
                start = time.perf_counter()
                try:
                    result = self.prepare_claim(cp, ref)
                except (
                    ClaimError,
                    configs.ConfigError,
                    hw.HardwareError,
                    MpsError,
                    cdi.CdiError,
                    NotFound,
                    imex_claims.ImexError,
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
            self.report_hardware(cp)
        if self.on_claims_change is not None:
            self.on_claims_change()
        return results

    def prepare_claim(self, cp: Checkpoint, ref: ClaimRef) -> PrepareResult:
        rec = cp.claims.get(ref.uid)
        if rec is not None and rec.phase == "PrepareCompleted":
            if rec.cdi_spec is None or not Path(rec.cdi_spec).exists():
                self._write_cdi(rec)  # the spec vanished (e.g. /var/run is tmpfs): rebuild it
                self.store.save(cp)
            return _result_from(rec)
        if rec is not None:
            log.info("rolling back a half-done prepare before redoing it", uid=ref.uid)
            self.undo(cp, rec)
        obj = self.claims.get_claim(ref.namespace, ref.name)
        alloc = parse_allocation(obj, ref.uid, self.settings.driver_name, self.settings.node_name)
        try:
            plan = planning.plan_claim(
                self._inventory or self.refresh(cp),
                cp.claims,
                alloc,
                self.settings.node_name,
                self.settings.driver_name,
            )
        except (ClaimError, configs.ConfigError) as exc:
            self.claims.claim_event(obj, "PrepareFailed", str(exc))
            raise
        for warning in plan.warnings:
            self.claims.claim_event(obj, "ConfigIgnored", warning)
        imex = self.imex.channel(alloc.uid, (g for _, g, _ in plan.devices), obj)  # before any change; may wait
        rec = ClaimRecord(
            uid=alloc.uid,
            namespace=alloc.namespace,
            name=alloc.name,
            phase="PrepareStarted",
            devices=[_device_record(a, g, s) for a, g, s in plan.devices],
            sharing=plan.sharing,
            imex_channel=imex.index if imex else None,
            imex_domain=imex.domain if imex else None,
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
            self.undo(cp, rec)
            if isinstance(exc, (hw.HardwareError, MpsError)):
                self.claims.claim_event(obj, "PrepareFailed", str(exc))
            raise
        rec.phase = "PrepareCompleted"
        rec.updated_at = time.time()
        self.store.save(cp)
        self._step("prepare:completed-recorded")
        return _result_from(rec)

    def _execute(self, cp: Checkpoint, rec: ClaimRecord, plan: planning.Plan) -> None:
        """The hardware steps, in order: each device's MIG instance (or MIG mode off for a whole GPU), then sharing."""
        owned = owned_instances(cp, exclude=rec.uid)
        for dev_rec, (_, gpu, slot) in zip(rec.devices, plan.devices, strict=True):
            if slot is not None and dev_rec.mig is not None:
                self.mig.create(dev_rec, gpu, slot, owned, lambda: self.store.save(cp))
            elif slot is None:
                self.mig.leave_mig_mode(gpu)
        self.sharing.setup(cp, rec, lambda: self.store.save(cp))

    def _write_cdi(self, rec: ClaimRecord) -> None:
        daemon = None
        if rec.mps_daemon:
            daemon = next((d for d in self.mps.list_daemons() if d.claim_uid == rec.uid), None)
            if daemon is None:
                raise MpsError(f"MPS daemon for claim {rec.uid} is not running")
        # Where the hardware's device nodes are on the host: the backend's own directory, or the dev root.
        host_dev = self.backend.device_node_dir() or self.settings.dev_root
        spec = cdi_assembly.claim_spec(rec, host_dev, self.mig.read_caps, daemon)
        path, ids = cdi.write_spec(self.settings.cdi_root, spec, self.settings.check_host_device_nodes)
        rec.cdi_spec = str(path)
        for d in rec.devices:
            d.cdi_ids = [ids[d.device]]

    # ---------------------------------------------------------------- unprepare
    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        results: dict[str, UnprepareResult] = {}
        with self.locked():
            cp = self.store.load().checkpoint
            for ref in claims:
                try:
                    rec = cp.claims.get(ref.uid)
                    if rec is not None:
                        self.undo(cp, rec)
                    else:
                        cdi.remove_spec(self.settings.cdi_root, ref.uid)
                    results[ref.uid] = UnprepareResult()
                except Exception as exc:
                    self.observer.failed("unprepare", _reason(exc))
                    log.exception("unprepare failed", uid=ref.uid)
                    results[ref.uid] = UnprepareResult(
                        error=f"unprepare failed: {exc}; kubelet retries, the driver log has details"
                    )
            self.report_hardware(cp)
        if self.on_claims_change is not None:
            self.on_claims_change()
        return results

    def undo(self, cp: Checkpoint, rec: ClaimRecord) -> None:
        """Remove everything a (possibly half-done) prepare made, in reverse order. Idempotent."""
        cdi.remove_spec(self.settings.cdi_root, rec.uid)
        self._step("undo:cdi-removed")
        self.sharing.undo(cp, rec)
        owned_elsewhere = owned_instances(cp, exclude=rec.uid)
        for d in reversed(rec.devices):
            if d.mig is None or not d.mig.created_by_driver:
                continue
            if not self.mig.destroy(d.mig, owned_elsewhere):  # its GPU fell off the bus: owed, not gone
                owed.owe(cp, rec, d.mig, self.claims)
                self.owing = True
                self.observer.failed("unprepare", "mig-instance-owed")
        cp.claims.pop(rec.uid, None)
        self.store.save(cp)
        self._step("undo:record-removed")

    # ----------------------------------------------------------------- recovery
    def recover(self) -> dict[str, int]:
        """At start-up: roll back half-done claims, drop what no completed claim owns (:class:`.recovery.Recovery`)."""
        return self.recovery.recover()

    def cleanup(self) -> dict[str, int]:
        """Periodic: unprepare claims whose ResourceClaim is gone or replaced (:class:`.recovery.Recovery`)."""
        return self.recovery.cleanup()

    def report_hardware(self, cp: Checkpoint) -> None:
        """Tell the observer how many MIG instances (owed ones too), MPS daemons and prepared devices there are."""
        mig = sum(1 for r in cp.claims.values() for d in r.devices if d.mig is not None and d.mig.gi_id is not None)
        mig += len(cp.owed_mig)  # they still exist on the hardware
        mps = sum(1 for r in cp.claims.values() if r.mps_daemon)
        prepared = sum(len(r.devices) for r in cp.claims.values() if r.phase == "PrepareCompleted")
        self.observer.hardware_changed(mig, mps, prepared, len(cp.owed_mig))

    def snapshot(self) -> Checkpoint:
        with self.locked():
            return self.store.load().checkpoint


# ----------------------------------------------------------------------- helpers
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
