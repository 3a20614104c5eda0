"""What a claim's containers got, written into the ResourceClaim's ``status.devices`` (KEP-4817, GA in 1.37).

After a claim is prepared, ``kubectl get resourceclaim -o yaml`` answers "what did I get?" without
logging into the node: per allocated device, the UUID CUDA sees (the MIG device's for a MIG
partition), the GPU it is on, the MIG profile, how it is shared (exclusive, MPS with its SM and
memory limits, time-sliced) and the MPS pipe directory in the container, and a ``Ready`` condition.
When the claim is unprepared the entries are withdrawn.

:func:`device_statuses` is pure (the checkpoint record in, the entries out).
:class:`ClaimStatusReporter` is the edge: a preparer wrapper that queues every claim prepared or
unprepared, and one thread that writes the entries into the claim's status (a merge patch with the
claim's uid and resourceVersion as preconditions; other drivers' and nodes' entries kept). The API
server lets a driver write only entries of its own driver, and only on claims allocated on its own
node: the ``associated-node:patch`` verb on ``resourceclaims/driver``, the only one the driver's role
grants. A write that fails is logged and retried a few times; it never fails or delays a prepare.
"""

from __future__ import annotations

import datetime
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from gpuplane.api import kubetime
from gpuplane.driver.prepare import contract
from gpuplane.driver.prepare.cdi_assembly import runtime_uuid
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, DeviceRecord
from gpuplane.driver.sharing.mps_spec import CONTAINER_PIPE_DIR

log = structlog.get_logger(__name__)

READY = "Ready"
RETRIES = 3


def _sharing(rec: ClaimRecord, d: DeviceRecord) -> dict[str, Any]:
    s = rec.sharing
    out: dict[str, Any] = {"strategy": s.strategy}
    if s.timeslice_interval:
        out["timeSliceInterval"] = s.timeslice_interval
    if s.mps_active_thread_percentage is not None:
        out["mpsActiveThreadPercentage"] = s.mps_active_thread_percentage
    limit = s.mps_pinned_limits.get(runtime_uuid(d))
    if limit is not None:
        out["mpsPinnedDeviceMemoryLimitBytes"] = limit
    if s.mps_client_priority is not None:
        out["mpsClientPriority"] = s.mps_client_priority
    return out


def device_data(rec: ClaimRecord, d: DeviceRecord) -> dict[str, Any]:
    """The ``data`` of one device's entry: what the container got."""
    data: dict[str, Any] = {
        "kind": d.kind,
        "uuid": runtime_uuid(d),
        "gpuUUID": d.gpu_uuid,
        "sharing": _sharing(rec, d),
        "cdiDevices": list(d.cdi_ids),
    }
    if d.mig is not None:
        data["migProfile"] = d.mig.profile_name
    if rec.mps_daemon:
        data["mpsPipeDirectory"] = CONTAINER_PIPE_DIR
    return data


def device_statuses(rec: ClaimRecord, driver: str, now: datetime.datetime) -> list[dict[str, Any]]:
    """``status.devices`` entries for a prepared claim, one per allocated device (and shareID)."""
    when = kubetime.rfc3339(now.timestamp())
    out: list[dict[str, Any]] = []
    for d in rec.devices:
        entry: dict[str, Any] = {
            "driver": driver,
            "pool": d.pool,
            "device": d.device,
            "conditions": [
                {
                    "type": READY,
                    "status": "True",
                    "reason": "Prepared",
                    "message": f"prepared on node {d.pool}: {d.kind} {runtime_uuid(d)}",
                    "lastTransitionTime": when,
                }
            ],
            "data": device_data(rec, d),
        }
        if d.share_id:
            entry["shareID"] = d.share_id
        out.append(entry)
    return out


@dataclass(frozen=True, slots=True)
class _Job:
    ref: contract.ClaimRef
    prepared: bool
    attempt: int = 0


Apply = Callable[[str, str, str, Sequence[Mapping[str, Any]]], None]
"""``apply(namespace, name, uid, devices)``: make this driver's entries of the claim's ``status.devices`` these."""


class ClaimStatusReporter:
    """Queues prepared and unprepared claims and writes their ``status.devices`` from one thread."""

    def __init__(
        self,
        snapshot: Callable[[], Checkpoint],
        apply: Apply,
        driver: str,
        *,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._snapshot = snapshot
        self._apply = apply
        self._driver = driver
        self._clock = clock
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def wrap(self, inner: contract.ClaimPreparer) -> contract.ClaimPreparer:
        """A preparer that reports every claim ``inner`` prepared or unprepared without an error."""
        return _Reporting(inner, self)

    def queue(self, refs: Sequence[contract.ClaimRef], results: Mapping[str, Any], prepared: bool) -> None:
        for ref in refs:
            result = results.get(ref.uid)
            if result is not None and not result.error:
                self._jobs.put(_Job(ref, prepared))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="claim-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def drain(self) -> None:
        """Write everything queued now, on this thread (tests; :meth:`start` for production)."""
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            if job is not None:
                self._write(job)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._write(job)

    def _write(self, job: _Job) -> None:
        ref = job.ref
        rec = self._snapshot().claims.get(ref.uid) if job.prepared else None
        if job.prepared and (rec is None or rec.phase != "PrepareCompleted"):
            return  # unprepared since (its own job withdraws the entries), or not prepared after all
        devices = device_statuses(rec, self._driver, self._clock()) if rec is not None else []
        try:
            self._apply(ref.namespace, ref.name, ref.uid, devices)
        except Exception as exc:  # never let a status write stop the reporter
            again = job.attempt + 1 < RETRIES
            log.warning(
                "claim.status_not_written",
                claim=f"{ref.namespace}/{ref.name}",
                uid=ref.uid,
                error=str(getattr(exc, "body", None) or exc)[:600],
                retry=again,
                hint="the driver's role needs resourceclaims/status patch and resourceclaims/driver "
                "associated-node:patch (manifests/driver/rbac.yaml)",
            )
            if again:
                self._jobs.put(_Job(ref, job.prepared, job.attempt + 1))


class _Reporting:
    """A ClaimPreparer that hands what ``inner`` did to the reporter."""

    def __init__(self, inner: contract.ClaimPreparer, reporter: ClaimStatusReporter) -> None:
        self._inner = inner
        self._reporter = reporter

    def prepare(self, claims: Sequence[contract.ClaimRef]) -> Mapping[str, contract.PrepareResult]:
        results = self._inner.prepare(claims)
        self._reporter.queue(claims, results, prepared=True)
        return results

    def unprepare(self, claims: Sequence[contract.ClaimRef]) -> Mapping[str, contract.UnprepareResult]:
        results = self._inner.unprepare(claims)
        self._reporter.queue(claims, results, prepared=False)
        return results
