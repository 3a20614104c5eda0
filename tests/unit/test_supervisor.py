"""controller.supervisor in real processes: a failed or stalled operator ends the replica, SIGTERM always does.

Each test starts ``tests/supervisor_worker.py`` (the Supervisor as
``gpuplane.controller.main`` runs it, around an operator that misbehaves in one way),
polls its ``/healthz`` over HTTP and signals it, then checks the exit code, the
time it took and that the Lease was released.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    markers: Path
    port: int

    def health(self) -> tuple[int, dict[str, object]]:
        """(HTTP status, body) of /healthz; (0, {}) when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as rsp:
                return rsp.status, json.loads(rsp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())
        except OSError:
            return 0, {}

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
        port_file = tmp_path / f"{mode}.port"
        markers = tmp_path / mode
        markers.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.supervisor_worker", mode, str(port_file), str(markers)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text():
            assert proc.poll() is None, "the worker exited before serving health"
            assert time.monotonic() < deadline, "the worker never served health"
            time.sleep(0.05)
        worker = Worker(proc, markers, int(port_file.read_text()))
        while worker.health()[0] != 200:
            assert time.monotonic() < deadline, f"never healthy: {worker.health()}"
            time.sleep(0.05)
        return worker

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
    assert w.health()[0] == 0  # nothing answers: the probe fails


def test_a_reported_failure_ends_a_lingering_operator_at_once(start: Start) -> None:
    w = start("report")
    code, took = w.wait_exit(10)
    assert code == 1 and took < 2.5  # reported 1 s in; kopf itself would linger for minutes
    assert w.released()


def test_a_stalled_loop_turns_unhealthy_within_seconds_then_exits(start: Start) -> None:
    w = start("stall")
    started = time.monotonic()
    while (status := w.health())[0] == 200:
        assert time.monotonic() - started < 5, "still healthy with a stuck event loop"
        time.sleep(0.1)
    unhealthy_after = time.monotonic() - started
    code_seen, body = status
    assert code_seen == 503 and "event loop has not run" in str(body["problem"])
    assert unhealthy_after < 1.0 + 1.5 + 1.0  # stalls 1 s in; 503 once silent 1.5 s
    code, took = w.wait_exit(10)
    assert code == 1 and w.released()
    assert unhealthy_after + took < 1.0 + 4.0 + 1.5  # exits once silent 4 s


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
    assert w.health()[0] == 503  # "stopping" at once
    code, took = w.wait_exit(10)
    assert code == 1 and 2.0 <= took < 3.5 and w.released()


def test_a_second_sigterm_exits_at_once(start: Start) -> None:
    w = start("deaf")
    w.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    w.proc.send_signal(signal.SIGTERM)
    code, took = w.wait_exit(10)
    assert code == 1 and took < 1.0
