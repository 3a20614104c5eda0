"""What the MPS tests share: the stand-in control binary, ids, the leak-checking ``root`` fixture and builders."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.driver.host import proc_running
from gpuplane.driver.sharing import mps, mps_spec
from testing.driverkit import mps_processes_under

STANDIN = Path(__file__).resolve().parent / "fakes" / "nvidia-cuda-mps-control"
GPU = "GPU-6f2a1e4c-3b7d-4e8a-9c1f-2d5b8a7e6c01"
MIG_A = "MIG-1a2b3c4d-0000-5e6f-8a9b-0c1d2e3f4a5b"
MIG_B = "MIG-9f8e7d6c-1111-5b4a-8c3d-2e1f0a9b8c7d"
GIB = 1024**3
CLAIM_A = "0b9c3f52-6a1e-4c7d-9e8f-1a2b3c4d5e6f"
CLAIM_B = "7e6d5c4b-3a29-4817-a6b5-c4d3e2f1a0b9"


@pytest.fixture(name="root")
def mps_root() -> Iterator[Path]:
    """A short temp dir (the control socket path must fit AF_UNIX); fails the test on leaked daemons."""
    path = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    try:
        yield path
        leaked = mps_processes_under(path)
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
        assert not leaked, f"MPS daemons leaked: {leaked}"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_control(root: Path, binary: Path = STANDIN, **kwargs: Any) -> mps.MpsControl:
    kwargs.setdefault("start_timeout_s", 5.0)
    kwargs.setdefault("command_timeout_s", 5.0)
    return mps.MpsControl(root / "mps", str(binary), **kwargs)


def wrapper_binary(root: Path, name: str, body: str) -> Path:
    """A control binary that sets test-only knobs, then runs the stand-in (same file name as the real one)."""
    path = root / name / "nvidia-cuda-mps-control"
    path.parent.mkdir()
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def make_spec(
    claim: str, pct: int | None, limits: dict[str, int], devices: tuple[str, ...] = (GPU,)
) -> mps_spec.MpsSpec:
    return mps_spec.MpsSpec(claim, devices, pct, limits)


def standin_record(daemon: mps_spec.MpsDaemon) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((daemon.log_dir / "standin-record.json").read_text())
    return data


is_running = proc_running  # the driver's own /proc reader: exists, neither zombie nor dead
