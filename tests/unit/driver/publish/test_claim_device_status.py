"""status.devices of a prepared claim (KEP-4817): what the container got, from the checkpoint record."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from gpuplane.driver.prepare import contract
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, DeviceRecord, MigRecord, SharingRecord
from gpuplane.driver.publish import claim_status
from gpuplane.driver.sharing.mps_spec import CONTAINER_PIPE_DIR

DRIVER = "gpu.gpuplane.dev"
NOW = datetime.datetime(2026, 12, 5, 12, 0, tzinfo=datetime.UTC)


def mig_mps_record(uid: str = "u1") -> ClaimRecord:
    return ClaimRecord(
        uid=uid,
        namespace="team-a",
        name="infer",
        phase="PrepareCompleted",
        devices=[
            DeviceRecord(
                request_names=["gpu"],
                pool="node-1",
                device="gpu-0-mig-1g.10gb-3",
                kind="mig",
                gpu_uuid="GPU-aaaa",
                gpu_minor=0,
                cdi_ids=["k8s.gpu.gpuplane.dev/claim=u1-gpu-0-mig-1g.10gb-3"],
                mig=MigRecord(parent_uuid="GPU-aaaa", profile_id=19, profile_name="1g.10gb", start=3, size=1,
                              gi_id=9, ci_id=0, mig_uuid="MIG-bbbb"),
            ),
            DeviceRecord(request_names=["gpu"], pool="node-1", device="gpu-1", kind="gpu", gpu_uuid="GPU-cccc",
                         gpu_minor=1, share_id="s-1"),
        ],
        sharing=SharingRecord(strategy="MPS", mps_active_thread_percentage=30,
                              mps_pinned_limits={"GPU-cccc": 8 << 30}, mps_client_priority=1),
        mps_daemon=True,
    )  # fmt: skip


def test_each_device_says_what_the_container_got() -> None:
    mig, whole = claim_status.device_statuses(mig_mps_record(), DRIVER, NOW)
    assert (mig["driver"], mig["pool"], mig["device"]) == (DRIVER, "node-1", "gpu-0-mig-1g.10gb-3")
    assert mig["data"] == {
        "kind": "mig",
        "uuid": "MIG-bbbb",  # what CUDA sees, not the parent's
        "gpuUUID": "GPU-aaaa",
        "migProfile": "1g.10gb",
        "sharing": {"strategy": "MPS", "mpsActiveThreadPercentage": 30, "mpsClientPriority": 1},
        "cdiDevices": ["k8s.gpu.gpuplane.dev/claim=u1-gpu-0-mig-1g.10gb-3"],
        "mpsPipeDirectory": CONTAINER_PIPE_DIR,
    }
    assert whole["data"]["sharing"]["mpsPinnedDeviceMemoryLimitBytes"] == 8 << 30
    assert whole["shareID"] == "s-1" and "shareID" not in mig
    assert "migProfile" not in whole["data"]
    (ready,) = mig["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert ready["lastTransitionTime"] == "2026-12-05T12:00:00Z"


def test_an_exclusive_whole_gpu_has_no_mps_fields() -> None:
    rec = ClaimRecord(
        uid="u2", namespace="n", name="c", phase="PrepareCompleted",
        devices=[DeviceRecord(request_names=["g"], pool="p", device="g3", kind="gpu", gpu_uuid="GPU-d", gpu_minor=3)],
    )  # fmt: skip
    (entry,) = claim_status.device_statuses(rec, DRIVER, NOW)
    assert entry["data"] == {"kind": "gpu", "uuid": "GPU-d", "gpuUUID": "GPU-d", "sharing": {"strategy": "Exclusive"},
                             "cdiDevices": []}  # fmt: skip


class Preparer:
    def __init__(self, checkpoint: Checkpoint, fail: set[str]) -> None:
        self.checkpoint, self.fail = checkpoint, fail

    def prepare(self, claims: Sequence[contract.ClaimRef]) -> Mapping[str, contract.PrepareResult]:
        return {c.uid: contract.PrepareResult(error="boom" if c.uid in self.fail else "") for c in claims}

    def unprepare(self, claims: Sequence[contract.ClaimRef]) -> Mapping[str, contract.UnprepareResult]:
        for c in claims:
            self.checkpoint.claims.pop(c.uid, None)
        return {c.uid: contract.UnprepareResult() for c in claims}


def test_reporter_writes_after_prepare_withdraws_after_unprepare_and_skips_failures() -> None:
    checkpoint = Checkpoint(claims={"u1": mig_mps_record("u1"), "u2": mig_mps_record("u2")})
    written: list[tuple[str, str, str, list[Any]]] = []
    reporter = claim_status.ClaimStatusReporter(
        lambda: checkpoint, lambda ns, name, uid, devices: written.append((ns, name, uid, list(devices))), DRIVER,
        clock=lambda: NOW,
    )  # fmt: skip
    preparer = reporter.wrap(Preparer(checkpoint, fail={"u2"}))
    refs = [contract.ClaimRef("team-a", "u1", "infer"), contract.ClaimRef("team-a", "u2", "other")]
    results = preparer.prepare(refs)
    assert results["u2"].error == "boom"  # the preparer's answer goes back unchanged
    reporter.drain()
    assert [(w[2], len(w[3])) for w in written] == [("u1", 2)]  # the failed claim is not reported
    preparer.unprepare(refs[:1])
    reporter.drain()
    assert written[-1][:3] == ("team-a", "infer", "u1") and written[-1][3] == []


def test_a_failing_write_is_retried_then_dropped_and_never_raises() -> None:
    checkpoint = Checkpoint(claims={"u1": mig_mps_record("u1")})
    calls: list[str] = []

    def refuse(ns: str, name: str, uid: str, devices: Sequence[Mapping[str, Any]]) -> None:
        calls.append(uid)
        raise RuntimeError("403 forbidden: resourceclaims/driver")

    reporter = claim_status.ClaimStatusReporter(lambda: checkpoint, refuse, DRIVER, clock=lambda: NOW)
    reporter.wrap(Preparer(checkpoint, fail=set())).prepare([contract.ClaimRef("team-a", "u1", "infer")])
    reporter.drain()
    assert calls == ["u1"] * claim_status.RETRIES


def test_a_claim_unprepared_before_its_write_is_not_reported_as_prepared() -> None:
    checkpoint = Checkpoint(claims={"u1": mig_mps_record("u1")})
    written: list[str] = []
    reporter = claim_status.ClaimStatusReporter(
        lambda: checkpoint, lambda ns, name, uid, devices: written.append(f"{uid}:{len(devices)}"), DRIVER
    )
    preparer = reporter.wrap(Preparer(checkpoint, fail=set()))
    ref = contract.ClaimRef("team-a", "u1", "infer")
    preparer.prepare([ref])
    preparer.unprepare([ref])
    reporter.drain()
    assert written == ["u1:0"]
