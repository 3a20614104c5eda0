"""A controller process with a misbehaving operator, for tests/unit/controller/test_supervisor.py.

    python -m tests.supervisor_worker MODE MARKER_DIR

Runs :class:`gpuplane.controller.supervisor.Supervisor` exactly as ``gpuplane.controller.main`` does
(signal handlers, ``exit_now``) around an operator that: ``ok`` stops when asked; ``fail``
raises after 1 s; ``report`` reports a failure after 1 s and lingers (kopf retrying on a
closed session after a watcher failed); ``stall`` blocks its event loop after 1 s and never
returns; ``deaf`` ignores the stop flag (keeps running, loop healthy); ``spin`` is ``ok``
with a main loop that polls without pause (a signal then lands mid-poll, wherever a lock
would be held, most of the time). MARKER_DIR/started
appears once the operator's loop runs, MARKER_DIR/released when the Lease is released,
MARKER_DIR/stopped when the ``ok`` operator saw the stop flag, MARKER_DIR/stalling when ``stall`` blocks.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuplane.controller import supervisor


def main() -> None:
    mode, markers = sys.argv[1], Path(sys.argv[2])

    async def operator(stop: threading.Event, failed: Callable[[str], None]) -> None:
        started = time.monotonic()
        (markers / "started").write_text("1")
        while True:
            await asyncio.sleep(0.05)
            if mode in ("ok", "spin") and stop.is_set():
                (markers / "stopped").write_text("1")
                return
            if time.monotonic() - started > 1.0:
                if mode == "fail":
                    raise RuntimeError("Watcher for resourceclaims has failed")
                if mode == "report":
                    failed("kopf's 'multidimensional multitasker' ended: RecursionError()")
                    await asyncio.sleep(3600)
                if mode == "stall":
                    (markers / "stalling").write_text("1")
                    time.sleep(3600)  # the whole event loop is stuck

    sup = supervisor.Supervisor(
        operator,
        release=lambda: (markers / "released").write_text("1"),
        timing=supervisor.Timing(
            beat_s=0.2, stall_exit_s=3.0, stop_grace_s=2.0, poll_s=0.0 if mode == "spin" else 0.25
        ),
    )
    sup.install_signal_handlers()
    supervisor.exit_now(sup.run())


if __name__ == "__main__":
    main()
