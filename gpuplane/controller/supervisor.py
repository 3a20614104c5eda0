"""Run the kopf operator in a thread under a supervisor that owns signals and the way out.

kopf handles SIGTERM on its own event loop and, after one of its watchers failed,
can spend minutes retrying requests on a closed session before it returns, with
its health endpoint and its signal waiter already cancelled while the Lease
thread keeps renewing: a leader that does nothing, answers no probe and ignores
SIGTERM (issue 18, reproduced against a real API server). The main thread here
keeps what must work even then:

* the operator (any coroutine; production: kopf's root tasks with a stop flag and
  kopf's ``/healthz``, :mod:`gpuplane.controller.probes`) runs in its own thread and
  event loop, with a heartbeat task beating every ``beat_s``; it calls
  ``failed(reason)`` the moment a part of it ends that should run forever;
* a reported failure, the operator thread ending on its own, or its loop not
  beating for ``stall_exit_s`` ends the process with exit code 1 after releasing
  the Lease, so the standby takes over at once and the pod restarts (kopf's
  ``/healthz`` is gone then, or, with a stalled loop, unanswered: kubelet's probe
  fails within its timeout);
* SIGTERM/SIGINT set the operator's stop flag, wait up to ``stop_grace_s`` for
  it, release the Lease and exit 0 (1 when the operator did not stop in time);
  a second signal exits at once.

The signal handler takes no lock: Python runs it in the main thread between two
bytecodes, possibly while that thread holds the very lock the handler would take
(``threading.Event.set`` from a handler deadlocked against the main loop's own
``Event.wait`` between two polls: the process then ignored SIGTERM and its stall
check for good). It counts the signal; the main loop sleeps and reads the count.

The process ends with ``os._exit`` once the Lease is released and the logs are
flushed: a thread stuck in a blocking call (an executor job, a hung socket)
cannot keep it alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import FrameType
from typing import Any

import structlog

log = structlog.get_logger(__name__)

Operator = Callable[[threading.Event, Callable[[str], None]], Coroutine[Any, Any, None]]  # (stop flag, failed)

EXIT_OK = 0
EXIT_FAILED = 1


@dataclass(frozen=True)
class Timing:
    """How fast the supervisor notices and acts (seconds)."""

    beat_s: float = 1.0
    stall_exit_s: float = 30.0
    stop_grace_s: float = 20.0
    poll_s: float = 0.25


class Supervisor:
    """One controller process: the operator thread, signals and the exit code."""

    def __init__(self, operator: Operator, *, release: Callable[[], None], timing: Timing = Timing()) -> None:
        self.operator = operator
        self.release = release
        self.timing = timing
        self.stop_flag = threading.Event()  # kopf's stop flag (kopf accepts a threading.Event)
        self.started = threading.Event()  # the operator's loop beat once
        self._signals = 0  # written by the signal handler only; read by the main loop (no lock: see the module doc)
        self._beat = time.monotonic()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._failed: str | None = None

    # --- the operator thread ---------------------------------------------------------------------
    async def _beating(self) -> None:
        while True:
            self._beat = time.monotonic()
            self.started.set()
            await asyncio.sleep(self.timing.beat_s)

    async def _operate(self) -> None:
        beater = asyncio.create_task(self._beating(), name="gpuplane heartbeat")
        try:
            await self.operator(self.stop_flag, self.report_failure)
        finally:
            beater.cancel()

    def report_failure(self, reason: str) -> None:
        """The operator is failing (thread-safe; the supervisor exits 1 at its next poll)."""
        if self._failed is None:
            self._failed = reason

    def _run_operator(self) -> None:
        try:
            asyncio.run(self._operate())
        except BaseException as exc:  # recorded for the supervisor; the thread ends either way
            self._error = exc

    def loop_age(self) -> float:
        """Seconds since the operator's event loop last beat."""
        return time.monotonic() - self._beat

    # --- signals and the main loop ---------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            # No logger here either (structlog's writer holds a lock the main thread may own): a raw write.
            with contextlib.suppress(OSError):
                os.write(2, f"second {signal.Signals(signum).name}: exiting at once\n".encode())
            os._exit(EXIT_FAILED)

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT go to the supervisor (main thread only)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def run(self) -> int:
        """Start the operator, watch it, and return the exit code (the caller ends the process with it)."""
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._run_operator, name="kopf-operator", daemon=True)
        self._thread.start()
        t = self.timing
        while True:
            time.sleep(t.poll_s)  # the handler runs mid-sleep, which then resumes (PEP 475): poll_s bounds the delay
            if self._signals:
                break
            if self._failed is not None:
                log.error("the operator failed; releasing the Lease and exiting", reason=self._failed)
                self.stop_flag.set()
                return self._finish(EXIT_FAILED)
            if not self._thread.is_alive():
                log.error("the operator stopped on its own; releasing the Lease and exiting", error=repr(self._error))
                return self._finish(EXIT_FAILED)
            age = self.loop_age()
            if age > t.stall_exit_s:
                log.error("the operator's event loop is stalled; releasing the Lease and exiting", stalled_s=age)
                self.stop_flag.set()
                return self._finish(EXIT_FAILED)
        log.info("stop requested; stopping the operator", grace_s=t.stop_grace_s)
        self.stop_flag.set()
        self._thread.join(t.stop_grace_s)
        if self._thread.is_alive():
            log.error("the operator did not stop in time; exiting anyway", grace_s=t.stop_grace_s)
            return self._finish(EXIT_FAILED)
        return self._finish(EXIT_OK)

    def _finish(self, code: int) -> int:
        try:
            self.release()
        except Exception:  # the standby then waits out the lease duration
            log.exception("releasing the Lease failed")
        return code


def exit_now(code: int) -> None:
    """Flush the logs and end the process, whatever other threads are doing."""
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
