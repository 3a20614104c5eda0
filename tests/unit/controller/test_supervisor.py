"""gpuplane.controller.supervisor in real processes: a failed or stalled operator ends the replica, SIGTERM always does.

Each test starts ``tests/supervisor_worker.py`` (the Supervisor as ``gpuplane.controller.main``
runs it, around an operator that misbehaves in one way), signals it, then checks
the exit code, the supervisor's logged decision (which rule ended the process, with the
figures it measured against its own timing) and that the Lease was released. No test asserts
a wall-clock window; ``EXIT_BOUND_S`` only keeps a hung worker from hanging the suite. (kopf's own
``/healthz``, which the operator serves in production, gives no answer once the
process is gone or its loop is blocked: tests/unit/controller/test_controller_probes.py.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuplane.controller import supervisor

ROOT = Path(__file__).resolve().parents[3]


EXIT_BOUND_S = 15.0


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    markers: Path
    log: Path

    def wait_exit(self) -> tuple[int, str]:
        """The exit code and everything the worker logged."""
        code = self.proc.wait(EXIT_BOUND_S)
        return code, self.log.read_text()

    def released(self) -> bool:
        return (self.markers / "released").exists()


Start = Callable[[str], Worker]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    procs: list[subprocess.Popen[bytes]] = []

    def run(mode: str) -> Worker:
        markers = tmp_path / f"{mode}-{len(procs)}"
        markers.mkdir()
        log = markers / "log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.supervisor_worker", mode, str(markers)],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not (markers / "started").exists():
            assert proc.poll() is None, "the worker exited before its operator started"
            assert time.monotonic() < deadline, "the operator never started"
            time.sleep(0.02)
        return Worker(proc, markers, log)

    yield run
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_sigterm_stops_a_healthy_replica_cleanly(start: Start) -> None:
    w = start("ok")
    w.proc.send_signal(signal.SIGTERM)
    code, log = w.wait_exit()
    assert code == 0 and "stop requested; stopping the operator" in log and "did not stop in time" not in log
    assert (w.markers / "stopped").exists() and w.released()


def test_a_failed_operator_releases_the_lease_and_exits_non_zero(start: Start) -> None:
    w = start("fail")
    code, log = w.wait_exit()
    assert code == 1 and "the operator stopped on its own" in log and "Watcher for resourceclaims has failed" in log
    assert w.released()


def test_a_reported_failure_ends_a_lingering_operator_at_once(start: Start) -> None:
    w = start("report")
    code, log = w.wait_exit()  # kopf itself would linger for minutes; the report ends it at the next poll
    assert code == 1 and "the operator failed; releasing the Lease and exiting" in log
    assert "multidimensional multitasker" in log and "stalled" not in log
    assert w.released()


def _stalled_s(log: str) -> float:
    match = re.search(r"stalled_s=([0-9.]+)", log)
    assert match is not None, log
    return float(match.group(1))


def test_a_stalled_loop_releases_the_lease_and_exits(start: Start) -> None:
    w = start("stall")
    code, log = w.wait_exit()
    assert code == 1 and w.released()
    assert "the operator's event loop is stalled" in log
    assert _stalled_s(log) > 3.0  # the worker's stall_exit_s: silent for longer than that, measured by the supervisor


def test_sigterm_ends_a_replica_whose_loop_is_stuck(start: Start) -> None:
    w = start("stall")
    until_stuck = w.markers / "stalling"
    while not until_stuck.exists():  # the worker marks the moment its loop blocks
        assert w.proc.poll() is None
        time.sleep(0.02)
    w.proc.send_signal(signal.SIGTERM)
    code, log = w.wait_exit()
    assert code == 1 and w.released()
    assert "the operator did not stop in time; exiting anyway" in log or "event loop is stalled" in log


def test_sigterm_ends_an_operator_that_ignores_its_stop_flag(start: Start) -> None:
    w = start("deaf")
    w.proc.send_signal(signal.SIGTERM)
    code, log = w.wait_exit()
    assert code == 1 and w.released()
    assert "the operator did not stop in time; exiting anyway" in log and "grace_s=2.0" in log


def test_a_second_sigterm_exits_at_once(start: Start) -> None:
    w = start("deaf")
    w.proc.send_signal(signal.SIGTERM)
    while "stop requested" not in w.log.read_text():  # the first one was taken
        assert w.proc.poll() is None
        time.sleep(0.02)
    w.proc.send_signal(signal.SIGTERM)
    code, log = w.wait_exit()
    assert code == 1 and "second SIGTERM: exiting at once" in log and "did not stop in time" not in log


def test_sigterm_mid_poll_always_stops_the_replica(start: Start) -> None:
    # Seen in CI: the handler's Event.set() landed while the main loop held that Event's lock
    # between two polls, and the replica ignored SIGTERM and its stall check for good. Polling
    # without pause puts the main loop inside its poll nearly all the time (2 of 10 such
    # replicas hung before the fix).
    for _ in range(6):
        w = start("spin")
        time.sleep(0.2)
        w.proc.send_signal(signal.SIGTERM)
        code, log = w.wait_exit()
        assert code == 0 and w.released() and "stop requested" in log


def test_the_signal_handler_takes_no_lock() -> None:
    # A Python signal handler runs in the main thread between two bytecodes, maybe while that
    # thread holds any lock; one it then takes deadlocks. Every C-level acquire is seen here.
    sup = supervisor.Supervisor(lambda stop, failed: _never(), release=lambda: None)
    calls: list[str] = []

    def profile(_frame: object, event: str, arg: object) -> None:
        if event == "c_call":
            calls.append(getattr(arg, "__name__", repr(arg)))

    sys.setprofile(profile)
    try:
        sup._on_signal(signal.SIGTERM, None)
    finally:
        sys.setprofile(None)
    assert sup._signals == 1
    assert not [c for c in calls if c in ("acquire", "__enter__", "acquire_lock")], calls


async def _never() -> None:
    raise AssertionError("the operator is not started here")
