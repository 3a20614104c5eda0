"""Recovery: at start-up and periodically, bring the node back to what the checkpoint says is prepared.

Side effects, through the transaction (:class:`~gpuplane.driver.prepare.state.DeviceState`), under
its locks:

- :func:`recover` (start-up): rolls back every claim left ``PrepareStarted`` (its MIG instances,
  MPS daemon, time-slices, CDI spec); after a *corrupt* checkpoint, prepares again each claim the
  API says is allocated here and whose CDI spec survived (the specs name the MIG instances the
  driver made, which stay the driver's); then sweeps: removes CDI specs of claims not completed
  and stops MPS daemons no record keeps; saves the checkpoint and republishes the inventory.
- :func:`cleanup` (periodic): unprepares checkpointed claims whose ResourceClaim is gone or was
  replaced (read from the API), then sweeps as above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from gpuplane.driver.kube import NotFound
from gpuplane.driver.prepare import cdi
from gpuplane.driver.prepare.checkpoint import Checkpoint
from gpuplane.driver.prepare.contract import ClaimRef

if TYPE_CHECKING:
    from gpuplane.driver.prepare.state import DeviceState

log = structlog.get_logger(__name__)


def recover(state: DeviceState) -> dict[str, int]:
    """At start-up: roll back half-done claims, drop what no completed claim owns."""
    with state.locked():
        loaded = state.store.load()
        cp = loaded.checkpoint
        stats = {"rolled_back": 0, "rebuilt": 0, "cdi_removed": 0, "mps_stopped": 0}
        for rec in [r for r in cp.claims.values() if r.phase == "PrepareStarted"]:
            state.undo(cp, rec)
            stats["rolled_back"] += 1
        if loaded.corrupt:
            stats["rebuilt"] = _rebuild_from_api(state, cp)
        stats.update(sweep(state, cp))
        state.store.save(cp)
        state.refresh(cp)  # reports the hardware to the observer
    log.info("recovery finished", **stats)
    return stats


def sweep(state: DeviceState, cp: Checkpoint) -> dict[str, int]:
    """Remove CDI specs of claims not completed and stop MPS daemons no record keeps."""
    root = state.settings.cdi_root
    completed = {uid for uid, r in cp.claims.items() if r.phase == "PrepareCompleted"}
    removed = 0
    for uid in cdi.list_claim_specs(root):
        if uid not in completed:
            cdi.remove_spec(root, uid)
            removed += 1
    keep = {uid for uid, r in cp.claims.items() if r.mps_daemon}
    stopped = state.sharing.mps.cleanup_orphans(keep)
    return {"cdi_removed": removed, "mps_stopped": len(stopped)}


def _rebuild_from_api(state: DeviceState, cp: Checkpoint) -> int:
    """After a corrupt checkpoint: re-prepare claims that were prepared here (their CDI spec exists)."""
    settings = state.settings
    specs = cdi.list_claim_specs(settings.cdi_root)
    # The specs name the MIG instances the driver made: they are the driver's, not an admin's.
    state.refresh(cp, {pair for path in specs.values() for pair in cdi.driver_mig_instances(path)})
    rebuilt = 0
    for obj in state.claims.list_claims():
        meta = obj.get("metadata", {})
        uid = meta.get("uid", "")
        results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        ours = [r for r in results if r.get("driver") == settings.driver_name and r.get("pool") == settings.node_name]
        if not ours or uid not in specs:
            continue
        try:
            state.prepare_claim(cp, ClaimRef(namespace=meta.get("namespace", ""), uid=uid, name=meta.get("name", "")))
            rebuilt += 1
        except Exception as exc:
            log.warning("could not rebuild claim from the API", uid=uid, error=str(exc))
    return rebuilt


def cleanup(state: DeviceState) -> dict[str, int]:
    """Periodic: unprepare checkpointed claims whose ResourceClaim is gone or replaced."""
    stale: list[ClaimRef] = []
    with state.locked():
        records = list(state.store.load().checkpoint.claims.values())
    for rec in records:
        try:
            obj = state.claims.get_claim(rec.namespace, rec.name)
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
        state.unprepare(stale)
    with state.locked():
        stats = sweep(state, state.store.load().checkpoint)
    stats["stale_unprepared"] = len(stale)
    return stats
