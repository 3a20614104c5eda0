"""A claim whose GPU fell off the bus is told so, once (issue 18, defect 7): Events from the checkpoint and taints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplane.driver.observe.claim_notices import REASON, ClaimNotices
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, DeviceRecord
from gpuplane.driver.publish.slices import DeviceTaint

LOST = DeviceTaint(key="gpu.gpuplane.dev/unhealthy", value="lost", effect="NoExecute")
NAMES = {"GPU-a": "gpu-0", "GPU-b": "gpu-1"}


class Events:
    def __init__(self) -> None:
        self.made: list[tuple[str, str, str]] = []

    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None:
        self.made.append((claim["metadata"]["name"], reason, message))


def _claim(name: str, uuid: str, kind: str = "gpu", phase: str = "PrepareCompleted") -> ClaimRecord:
    device = DeviceRecord(request_names=["g"], pool="n", device=name, kind=kind, gpu_uuid=uuid, gpu_minor=0)
    return ClaimRecord.model_validate(
        {"uid": f"u-{name}", "namespace": "ns", "name": name, "phase": phase, "devices": [device.model_dump()]}
    )


def _checkpoint() -> Checkpoint:
    claims = [_claim("whole", "GPU-a"), _claim("mig", "GPU-a", kind="mig"), _claim("other", "GPU-b")]
    claims.append(_claim("half", "GPU-a", phase="PrepareStarted"))
    return Checkpoint(claims={c.uid: c for c in claims})


def test_the_claims_on_a_lost_gpu_get_one_warning_each() -> None:
    events = Events()
    notices = ClaimNotices(_checkpoint, events)
    assert notices.notify({"gpu-0": (LOST,)}, NAMES) == 2
    assert sorted(name for name, _, _ in events.made) == ["mig", "whole"]  # not gpu-1's, not a half-prepared one
    _, reason, message = events.made[0]
    assert reason == REASON and "GPU gpu-0 of this claim is unhealthy (gpu.gpuplane.dev/unhealthy=lost" in message
    assert "delete the pod" in message
    assert notices.notify({"gpu-0": (LOST,)}, NAMES) == 0  # the same taint again: told once


def test_a_cleared_taint_that_returns_is_told_again() -> None:
    events = Events()
    notices = ClaimNotices(_checkpoint, events)
    notices.notify({"gpu-0": (LOST,)}, NAMES)
    notices.notify({}, NAMES)
    assert notices.notify({"gpu-0": (LOST,)}, NAMES) == 2


def test_a_failing_event_write_is_not_fatal() -> None:
    class Broken(Events):
        def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None:
            raise RuntimeError("apiserver down")

    assert ClaimNotices(_checkpoint, Broken()).notify({"gpu-0": (LOST,)}, NAMES) == 0
