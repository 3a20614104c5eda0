"""Tell the users of a prepared claim that one of its GPUs turned unhealthy (issue 18, defect 7).

A GPU that falls off the bus (or takes a fatal Xid) is tainted in the ResourceSlice, so nothing
new lands on it; the pod already using it kept Running with no word to its owner. When the
health watcher's taints change, :meth:`ClaimNotices.notify` finds each completed claim of the
checkpoint holding a device on a newly tainted GPU (its whole GPU or a MIG instance on it) and
records one Warning Event ``DeviceUnhealthy`` on the claim: which GPU, which taint, what to do.
Each (claim, GPU, taint) is told once while the taint lasts; a cleared taint may be told again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from gpuplane.driver.prepare.checkpoint import Checkpoint
from gpuplane.driver.publish.slices import DeviceTaint

log = structlog.get_logger(__name__)

REASON = "DeviceUnhealthy"


class ClaimEvents(Protocol):
    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None: ...


class ClaimNotices:
    """One Warning Event per claim and unhealthy GPU it holds."""

    def __init__(self, checkpoint: Callable[[], Checkpoint], events: ClaimEvents) -> None:
        self.checkpoint = checkpoint
        self.events = events
        self._told: set[tuple[str, str, str]] = set()  # (claim uid, GPU device name, taint key=value)

    def notify(self, taints: Mapping[str, Sequence[DeviceTaint]], gpu_names: Mapping[str, str]) -> int:
        """Tell the claims on GPUs tainted now; ``gpu_names`` maps GPU uuid -> device name. Returns Events made."""
        active = {(gpu, f"{t.key}={t.value}") for gpu, ts in taints.items() for t in ts}
        self._told = {k for k in self._told if (k[1], k[2]) in active}  # cleared: may be told again
        made = 0
        for record in self.checkpoint().claims.values():
            if record.phase != "PrepareCompleted":
                continue
            gpus = sorted({gpu_names.get(d.gpu_uuid, "") for d in record.devices} - {""})
            for gpu in gpus:
                for taint in taints.get(gpu, ()):
                    key = (record.uid, gpu, f"{taint.key}={taint.value}")
                    if key in self._told:
                        continue
                    self._told.add(key)
                    meta = {"metadata": {"uid": record.uid, "namespace": record.namespace, "name": record.name}}
                    message = (
                        f"GPU {gpu} of this claim is unhealthy ({taint.key}={taint.value}, effect {taint.effect}); "
                        "the pod using it may have lost its device: delete the pod (or let its controller) so it "
                        "is scheduled again on a healthy GPU"
                    )
                    try:
                        self.events.claim_event(meta, REASON, message, warning=True)
                    except Exception as exc:  # an Event is best effort; the taint is already published
                        log.warning("could not record DeviceUnhealthy", claim=record.uid, error=str(exc))
                        continue
                    made += 1
                    log.warning("claim told its GPU is unhealthy", claim=f"{record.namespace}/{record.name}", gpu=gpu)
        return made
