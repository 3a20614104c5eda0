"""Recovery: at start-up and periodically, bring the node back to what the checkpoint says is prepared.

:class:`Recovery` is its own object with a narrow interface: what it may do to the node goes through
the prepare transaction's five operations (:class:`Transaction`: the lock, a claim's undo, prepare and
unprepare, the inventory's refresh; :class:`~gpuplane.driver.prepare.state.DeviceState` is one), and
what it reads is handed in (the checkpoint store, the claims API, the CDI directory, the node and driver
names, the MPS daemons to sweep). Side effects, under the transaction's locks:

- :meth:`Recovery.recover` (start-up): rolls back every claim left ``PrepareStarted`` (its MIG instances,
  MPS daemon, time-slices, CDI spec); after a *corrupt* checkpoint, prepares again each claim the
  API says is allocated here and whose CDI spec survived (the specs name the MIG instances the
  driver made, which stay the driver's); then sweeps: removes CDI specs of claims not completed
  and stops MPS daemons no record keeps; saves the checkpoint and republishes the inventory.
- :meth:`Recovery.cleanup` (periodic): unprepares checkpointed claims whose ResourceClaim is gone or was
  replaced (read from the API), then sweeps as above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from gpuplane.driver.kube import NotFound
from gpuplane.driver.prepare import cdi
from gpuplane.driver.prepare.checkpoint import Checkpoint, CheckpointStore, ClaimRecord
from gpuplane.driver.prepare.contract import ClaimRef

log = structlog.get_logger(__name__)


class Transaction(Protocol):
    """The prepare transaction's operations recovery uses (``DeviceState`` implements them)."""

    def locked(self) -> contextlib.AbstractContextManager[Any]: ...

    def undo(self, cp: Checkpoint, rec: ClaimRecord) -> None: ...

    def refresh(self, cp: Checkpoint, also_owned: Iterable[tuple[str, int]] = ()) -> object: ...

    def prepare_claim(self, cp: Checkpoint, ref: ClaimRef) -> object: ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> object: ...


class Daemons(Protocol):
    """The MPS control daemons (``MpsControl``): recovery's sweep stops those no claim keeps."""

    def cleanup_orphans(self, keep: set[str]) -> Sequence[object]: ...


class Where(Protocol):
    """The node, the driver and the CDI directory (``StateSettings`` has them)."""

    @property
    def cdi_root(self) -> Path: ...

    @property
    def driver_name(self) -> str: ...

    @property
    def node_name(self) -> str: ...


class Claims(Protocol):
    """The ResourceClaims recovery reads from the API."""

    def list_claims(self) -> Sequence[Mapping[str, Any]]: ...

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class Recovery:
    """Start-up recovery and the periodic cleanup of one node's prepared claims."""

    def __init__(
        self, txn: Transaction, store: CheckpointStore, claims: Claims, where: Where, daemons: Daemons
    ) -> None:
        self.txn, self.store, self.claims, self.daemons = txn, store, claims, daemons
        self.cdi_root, self.driver_name, self.node_name = where.cdi_root, where.driver_name, where.node_name

    def recover(self) -> dict[str, int]:
        """At start-up: roll back half-done claims, drop what no completed claim owns."""
        with self.txn.locked():
            loaded = self.store.load()
            cp = loaded.checkpoint
            stats = {"rolled_back": 0, "rebuilt": 0, "cdi_removed": 0, "mps_stopped": 0}
            for rec in [r for r in cp.claims.values() if r.phase == "PrepareStarted"]:
                self.txn.undo(cp, rec)
                stats["rolled_back"] += 1
            if loaded.corrupt:
                stats["rebuilt"] = self._rebuild_from_api(cp)
            stats.update(self.sweep(cp))
            self.store.save(cp)
            self.txn.refresh(cp)  # reports the hardware to the observer
        log.info("recovery finished", **stats)
        return stats

    def sweep(self, cp: Checkpoint) -> dict[str, int]:
        """Remove CDI specs of claims not completed and stop MPS daemons no record keeps."""
        completed = {uid for uid, r in cp.claims.items() if r.phase == "PrepareCompleted"}
        removed = 0
        for uid in cdi.list_claim_specs(self.cdi_root):
            if uid not in completed:
                cdi.remove_spec(self.cdi_root, uid)
                removed += 1
        keep = {uid for uid, r in cp.claims.items() if r.mps_daemon}
        stopped = self.daemons.cleanup_orphans(keep)
        return {"cdi_removed": removed, "mps_stopped": len(stopped)}

    def _rebuild_from_api(self, cp: Checkpoint) -> int:
        """After a corrupt checkpoint: re-prepare claims that were prepared here (their CDI spec exists)."""
        specs = cdi.list_claim_specs(self.cdi_root)
        # The specs name the MIG instances the driver made: they are the driver's, not an admin's.
        self.txn.refresh(cp, {pair for path in specs.values() for pair in cdi.driver_mig_instances(path)})
        rebuilt = 0
        for obj in self.claims.list_claims():
            meta = obj.get("metadata", {})
            uid = meta.get("uid", "")
            results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            ours = [r for r in results if r.get("driver") == self.driver_name and r.get("pool") == self.node_name]
            if not ours or uid not in specs:
                continue
            try:
                ref = ClaimRef(namespace=meta.get("namespace", ""), uid=uid, name=meta.get("name", ""))
                self.txn.prepare_claim(cp, ref)
                rebuilt += 1
            except Exception as exc:
                log.warning("could not rebuild claim from the API", uid=uid, error=str(exc))
        return rebuilt

    def cleanup(self) -> dict[str, int]:
        """Periodic: unprepare checkpointed claims whose ResourceClaim is gone or replaced."""
        stale: list[ClaimRef] = []
        with self.txn.locked():
            records = list(self.store.load().checkpoint.claims.values())
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
            self.txn.unprepare(stale)
        with self.txn.locked():
            stats = self.sweep(self.store.load().checkpoint)
        stats["stale_unprepared"] = len(stale)
        return stats
