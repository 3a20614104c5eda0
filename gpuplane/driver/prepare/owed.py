"""MIG instances the driver owes: made for a claim, not destroyed at its unprepare because the GPU fell off the bus.

An unprepare must let kubelet finish with the pod (retrying cannot reach a GPU that does not
answer), but it must not pretend the instance is gone: :func:`owe` records it in the checkpoint
(``Checkpoint.owed_mig``, saved with the claim's removal), logs a warning and tells the claim with
a Warning Event ``MigInstanceOwed``. :func:`settle` runs before every discovery, so before the
GPU's devices are published again: for each owed instance whose GPU answers, it destroys the
instance (its compute instances first) or finds it gone (a reset or a reboot wipes MIG
instances), and drops the record. A GPU that answers but whose owed instance could not be
destroyed is *withheld*: it offers no device until a later pass succeeds.

Side effects: the hardware backend (destroy), the checkpoint (through ``save``), logs, Events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, MigRecord, OwedMig
from gpuplane.driver.prepare.mig_ops import GPU_AWAY, MigOps

log = structlog.get_logger(__name__)

EVENT_REASON = "MigInstanceOwed"


class EventSink(Protocol):
    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None: ...


def owe(cp: Checkpoint, rec: ClaimRecord, mig: MigRecord, events: EventSink) -> OwedMig:
    """Record that ``mig`` (of claim ``rec``) still exists on a GPU that does not answer; log and tell the claim."""
    owed = OwedMig(
        parent_uuid=mig.parent_uuid,
        profile_id=mig.profile_id,
        profile_name=mig.profile_name,
        start=mig.start,
        size=mig.size,
        gi_id=mig.gi_id,
        claim=f"{rec.namespace}/{rec.name} ({rec.uid})",
    )
    cp.owed_mig.append(owed)
    text = (
        f"MIG instance {mig.profile_name}@{mig.start} (GI {mig.gi_id}) of this claim could not be destroyed: "
        f"GPU {mig.parent_uuid} does not answer (fell off the bus). The claim is released; the driver destroys "
        "the instance when the GPU answers again, before it offers the GPU again (a GPU reset or a node reboot "
        "also removes it)"
    )
    log.warning(
        "MIG instance owed: its GPU does not answer",
        claim=owed.claim,
        gpu=mig.parent_uuid,
        gi_id=mig.gi_id,
        profile=mig.profile_name,
        start=mig.start,
    )
    claim = {"metadata": {"namespace": rec.namespace, "name": rec.name, "uid": rec.uid}}
    try:
        events.claim_event(claim, EVENT_REASON, text)
    except Exception:  # an Event is best effort; the record and the log line are what count
        log.exception("could not record the owed-instance event", claim=owed.claim)
    return owed


def _as_record(owed: OwedMig) -> MigRecord:
    return MigRecord(
        parent_uuid=owed.parent_uuid,
        profile_id=owed.profile_id,
        profile_name=owed.profile_name,
        start=owed.start,
        size=owed.size,
        gi_id=owed.gi_id,
    )


def settle(mig: MigOps, cp: Checkpoint, save: Callable[[], None]) -> set[str]:
    """Destroy the owed instances whose GPU answers; returns the uuids of GPUs to withhold (still owing)."""
    if not cp.owed_mig:
        return set()
    held = {
        (d.mig.parent_uuid, d.mig.gi_id)
        for r in cp.claims.values()
        for d in r.devices
        if d.mig is not None and d.mig.gi_id is not None
    }
    still: list[OwedMig] = []
    withheld: set[str] = set()
    for owed in cp.owed_mig:
        others = held | {(o.parent_uuid, o.gi_id) for o in cp.owed_mig if o is not owed and o.gi_id is not None}
        try:
            done = mig.destroy(_as_record(owed), others)
        except hw.HardwareError as exc:
            if exc.code not in GPU_AWAY:
                withheld.add(owed.parent_uuid)
                log.warning(
                    "could not destroy an owed MIG instance; its GPU offers nothing until it is", error=str(exc)
                )
            still.append(owed)
            continue
        if not done:
            still.append(owed)  # the GPU still does not answer
            continue
        log.info(
            "owed MIG instance settled (destroyed, or wiped by a reset) before the GPU is offered again",
            claim=owed.claim,
            gpu=owed.parent_uuid,
            gi_id=owed.gi_id,
            profile=owed.profile_name,
            owed_for_s=round(max(0.0, time.time() - owed.since), 1),
        )
    if len(still) != len(cp.owed_mig):
        cp.owed_mig = still
        save()
    return withheld
