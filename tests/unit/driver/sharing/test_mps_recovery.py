"""MPS daemons across driver restarts and crashes: found again, stopped, cleaned up; nothing leaks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testing.driverkit import mps_processes_under
from tests.mpskit import (
    CLAIM_A,
    CLAIM_B,
    GIB,
    GPU,
    STANDIN,
    is_running,
    make_control,
    make_spec,
    mps_root,  # noqa: F401  (the leak-checking fixture, named root)
    standin_record,
)


def test_a_restarted_driver_finds_and_stops_daemons_of_its_previous_life(root: Path) -> None:
    before = make_control(root)
    a = before.start(make_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    b = before.start(make_spec(CLAIM_B, 20, {GPU: 2 * GIB}))
    del before  # the driver "crashes": only the disk and the processes remain

    after = make_control(root)
    assert {d.claim_uid: d.pid for d in after.list_daemons()} == {CLAIM_A: a.pid, CLAIM_B: b.pid}
    assert after.cleanup_orphans(keep={CLAIM_B}) == [CLAIM_A]
    assert a.pid is not None and not is_running(a.pid)
    assert not a.root.exists()
    assert after.alive(CLAIM_B)
    # A kept claim's daemon is returned as is by a repeated prepare.
    assert after.start(make_spec(CLAIM_B, 20, {GPU: 2 * GIB})) == b
    assert after.cleanup_orphans(keep=set()) == [CLAIM_B]
    assert after.list_daemons() == []


def test_crash_between_launch_and_record_is_recovered(root: Path) -> None:
    control = make_control(root)
    first = control.start(make_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    assert first.pid is not None
    # As if SIGKILLed right after `-d` returned: the record still says "starting", no pid.
    record_path = first.root / "daemon.json"
    record = json.loads(record_path.read_text())
    record.update(phase="starting", pid=None)
    record_path.write_text(json.dumps(record))

    restarted = make_control(root)
    assert restarted.alive(CLAIM_A)  # found through the daemon's pid file
    # A repeated prepare does not trust a half-configured daemon: it starts over.
    second = restarted.start(make_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    assert second.pid != first.pid
    assert not is_running(first.pid)
    assert standin_record(second)["defaults"]["active_thread_percentage"] == 60.0
    restarted.stop(CLAIM_A)


def test_daemon_found_from_its_environment_when_pid_file_and_record_are_gone(root: Path) -> None:
    control = make_control(root)
    daemon = control.start(make_spec(CLAIM_A, 60, {}))
    assert daemon.pid is not None
    (daemon.root / "daemon.json").unlink()
    (daemon.pipe_dir / "nvidia-cuda-mps-control.pid").unlink()
    restarted = make_control(root)
    assert restarted.alive(CLAIM_A)
    assert restarted.list_daemons() == []  # no record: not listed, but still cleaned up
    assert restarted.cleanup_orphans(keep=set()) == [CLAIM_A]
    assert not is_running(daemon.pid)


def test_daemon_whose_claim_dir_vanished_is_killed(root: Path) -> None:
    control = make_control(root)
    daemon = control.start(make_spec(CLAIM_A, 60, {}))
    assert daemon.pid is not None
    shutil.rmtree(daemon.root)
    assert make_control(root).cleanup_orphans(keep=set()) == [CLAIM_A]
    assert not is_running(daemon.pid)


def test_half_made_and_corrupt_dirs_are_removed(root: Path) -> None:
    half = root / "mps" / CLAIM_A
    (half / "pipe").mkdir(parents=True)
    corrupt = root / "mps" / CLAIM_B
    corrupt.mkdir()
    (corrupt / "daemon.json").write_text("{not json")
    kept = root / "mps" / "kept-claim"
    (kept / "log").mkdir(parents=True)
    control = make_control(root)
    assert control.list_daemons() == []
    assert control.cleanup_orphans(keep={"kept-claim"}) == [CLAIM_A, CLAIM_B]
    assert not half.exists() and not corrupt.exists() and kept.exists()


def test_a_half_made_dir_does_not_block_a_new_start(root: Path) -> None:
    (root / "mps" / CLAIM_A / "pipe").mkdir(parents=True)
    control = make_control(root)
    daemon = control.start(make_spec(CLAIM_A, 30, {}))
    assert control.alive(CLAIM_A) and standin_record(daemon)["defaults"]["active_thread_percentage"] == 30.0
    control.stop(CLAIM_A)


def test_stop_escalates_to_signals_when_quit_gets_no_answer(root: Path) -> None:
    control = make_control(root, command_timeout_s=0.5)
    daemon = control.start(make_spec(CLAIM_A, 60, {}))
    assert daemon.pid is not None
    os.kill(daemon.pid, signal.SIGSTOP)  # a hung daemon: `quit` gets no answer
    started = time.monotonic()
    control.stop(CLAIM_A)
    assert not is_running(daemon.pid)
    assert not daemon.root.exists()
    assert time.monotonic() - started < 9


_DRIVER = """
import sys
from pathlib import Path
from gpuplane.driver.sharing import mps, mps_spec
control = mps.MpsControl(Path(sys.argv[1]), sys.argv[2], start_timeout_s=5, command_timeout_s=5)
print("go", flush=True)
control.start(mps_spec.MpsSpec(sys.argv[3], (sys.argv[4],), 60, {sys.argv[4]: 6 * 1024**3}))
print("ready", flush=True)
"""


@pytest.mark.parametrize("kill_after_s", [0.0, 0.03, 0.08, 0.15, 0.25, 0.4])
def test_sigkill_of_the_driver_at_any_step_leaks_no_daemon(root: Path, kill_after_s: float) -> None:
    repo = Path(__file__).resolve().parents[4]
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(root / "mps"), str(STANDIN), CLAIM_A, GPU],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == "go"
    time.sleep(kill_after_s)
    driver.kill()
    driver.wait()

    restarted = make_control(root)
    assert restarted.cleanup_orphans(keep=set()) in ([], [CLAIM_A])
    assert not (root / "mps" / CLAIM_A).exists()
    deadline = time.monotonic() + 5  # a client the dead driver had in flight may still be exiting
    while mps_processes_under(root):
        assert time.monotonic() < deadline, mps_processes_under(root)
        time.sleep(0.05)
