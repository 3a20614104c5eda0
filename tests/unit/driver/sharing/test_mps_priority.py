"""MPS client priority per claim: the daemon's default (set, read back, recorded by the stand-in).

The CDI side (``CUDA_MPS_CLIENT_PRIORITY`` in the containers' env) is checked through the driver's
prepare path in test_sharing.

Against the stand-in daemon (tests/fakes/nvidia-cuda-mps-control), which answers
``set_default_client_priority``/``get_default_client_priority`` with NVIDIA's values (0 normal,
1 below normal) and records its defaults and environment in ``standin-record.json``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplane.driver.sharing import mps_client, mps_spec
from tests.mpskit import (
    CLAIM_A as GOLD,
)
from tests.mpskit import (
    CLAIM_B as BRONZE,
)
from tests.mpskit import (
    GPU,
    make_control,
    mps_root,  # noqa: F401  (the leak-checking fixture, named root)
    standin_record,
)


def test_each_tier_daemon_has_its_priority_set_read_back_and_in_its_environment(root: Path) -> None:
    control = make_control(root)
    try:
        gold = control.start(mps_spec.MpsSpec(GOLD, (GPU,), 60, {}, client_priority=0))
        bronze = control.start(mps_spec.MpsSpec(BRONZE, (GPU,), 20, {}, client_priority=1))
        for daemon, want in ((gold, 0), (bronze, 1)):
            rec = standin_record(daemon)
            assert rec["defaults"]["client_priority"] == want
            assert rec["env"]["CUDA_MPS_CLIENT_PRIORITY"] == str(want)
            told = [c["command"] for c in rec["commands"]]
            assert f"set_default_client_priority {want}" in told and "get_default_client_priority" in told
            assert daemon.container_env(want)["CUDA_MPS_CLIENT_PRIORITY"] == str(want)
        # A claim recorded without a priority keeps the daemon's default and gets no variable.
        assert gold.container_env() == {"CUDA_MPS_PIPE_DIRECTORY": mps_spec.CONTAINER_PIPE_DIR}
    finally:
        control.cleanup_orphans(set())


def test_an_out_of_range_priority_is_refused_before_anything_is_made(root: Path) -> None:
    control = make_control(root)
    with pytest.raises(mps_spec.MpsError, match="client priority 2 is not 0"):
        control.start(mps_spec.MpsSpec(GOLD, (GPU,), 60, {}, client_priority=2))
    assert not (root / "mps" / GOLD).exists()


@pytest.mark.parametrize(
    ("reply", "value"), [("0", 0), ("1", 1), ("1 [BELOW NORMAL]", 1), ("BELOW_NORMAL", 1), ("NORMAL", 0), ("?", None)]
)
def test_priority_replies_are_read_back(reply: str, value: int | None) -> None:
    assert mps_client.parse_priority(reply) == value
