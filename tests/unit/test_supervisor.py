"""gpuplane.controller.supervisor in real processes: a failed or stalled operator ends the replica, SIGTERM always does.

Each test starts ``tests/supervisor_worker.py`` (the Supervisor as ``gpuplane.controller.main``
runs it, around an operator that misbehaves in one way), signals it, then checks
the exit code, the time it took and that the Lease was released. (kopf's own
``/healthz``, which the operator serves in production, gives no answer once the
process is gone or its loop is blocked: tests/unit/test_controller_probes.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuplane.controller import supervisor

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    markers: Path

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        started = time.monotonic()
        code = self.proc.wait(timeout)
        return code, time.monotonic() - started

    def released(self) -> bool:
        return (self.markers / "released").exists()


Start = Callable[[str], Worker]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    procs: list[subprocess.Popen[bytes]] = []

    def run(mode: str) -> Worker:
        markers = tmp_path / f"{mode}-{len(procs)}"
        markers.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.supervisor_worker", mode, str(markers)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not (markers / "started").exists():
            assert proc.poll() is None, "the worker exited before its operator started"
            assert time.monotonic() < deadline, "the operator never started"
            time.sleep(0.02)
        return Worker(proc, markers)

    yield run
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_sigterm_stops_a_healthy_replica_cleanly(start: Start) -> None:
    w = start("ok")
    w.proc.send_signal(signal.SIGTERM)
    code, took = w.wait_exit(10)
    assert code == 0 and took < 2.0
    assert (w.markers / "stopped").exists() and w.released()


def test_a_failed_operator_releases_the_lease_and_exits_non_zero(start: Start) -> None:
    w = start("fail")
    code, took = w.wait_exit(10)
    assert code == 1 and took < 3.0  # fails 1 s in, noticed within a poll
    assert w.released()


def test_a_reported_failure_ends_a_lingering_operator_at_once(start: Start) -> None:
    w = start("report")
    code, took = w.wait_exit(10)
    assert code == 1 and took < 2.5  # reported 1 s in; kopf itself would linger for minutes
    assert w.released()


def test_a_stalled_loop_releases_the_lease_and_exits(start: Start) -> None:
    w = start("stall")
    code, took = w.wait_exit(10)
    assert code == 1 and w.released()
    assert 1.0 + 3.0 - 0.5 < took < 1.0 + 3.0 + 1.5  # stalls 1 s in; exits once silent 3 s


def test_sigterm_ends_a_replica_whose_loop_is_stuck(start: Start) -> None:
    w = start("stall")
    time.sleep(1.5)  # the loop is stuck now
    w.proc.send_signal(signal.SIGTERM)
    code, took = w.wait_exit(10)
    assert code == 1 and took < 2.0 + 1.0  # the stop grace, then out anyway
    assert w.released()


def test_sigterm_ends_an_operator_that_ignores_its_stop_flag(start: Start) -> None:
    w = start("deaf")
    w.proc.send_signal(signal.SIGTERM)
    code, took = w.wait_exit(10)
    assert code == 1 and 2.0 <= took < 3.5 and w.released()


def test_a_second_sigterm_exits_at_once(start: Start) -> None:
    w = start("deaf")
    w.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    w.proc.send_signal(signal.SIGTERM)
    code, took = w.wait_exit(10)
    assert code == 1 and took < 1.0


def test_sigterm_mid_poll_always_stops_the_replica(start: Start) -> None:
    # Seen in CI: the handler's Event.set() landed while the main loop held that Event's lock
    # between two polls, and the replica ignored SIGTERM and its stall check for good. Polling
    # without pause puts the main loop inside its poll nearly all the time (2 of 10 such
    # replicas hung before the fix).
    for _ in range(6):
        w = start("spin")
        time.sleep(0.2)
        w.proc.send_signal(signal.SIGTERM)
        code, took = w.wait_exit(10)
        assert code == 0 and took < 2.0 and w.released()


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
