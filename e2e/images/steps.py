"""Run one long external command (mmdebstrap, buildah) with progress shown and its output kept.

Every line goes to a log file; lines that say where the command is (buildah's
``STEP n/m``, mmdebstrap's ``I:`` lines) are echoed, and a heartbeat is printed
when the command has been quiet for a while. A failure raises
:class:`StepError` with the command, its exit code, the log path and the log's tail.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from e2e.cluster import build

Printer = Callable[[str], None]

HEARTBEAT_S = 30.0
# Lines worth showing while a build runs.
PROGRESS = re.compile(r"^(\[\d+/\d+\] )?STEP \d+/\d+|^I: |^Successfully tagged|^--> Using cache|^COMMIT")


class StepError(RuntimeError):
    """An external build command failed; the message has its output's tail and what to do."""


def fmt_seconds(seconds: float) -> str:
    """``75.2`` -> ``1m15s``; under a minute -> ``12.3s`` (:func:`e2e.cluster.build.fmt_seconds`)."""
    return build.fmt_seconds(seconds, decimals=1)


def run(
    cmd: Sequence[str],
    *,
    label: str,
    log: Path,
    out: Printer,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    hint: str = "",
    progress: re.Pattern[str] = PROGRESS,
) -> float:
    """Run ``cmd`` to completion; return the seconds it took. Raise StepError when it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    last_line = [started]
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=dict(os.environ if env is None else env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(5.0):
                now = time.monotonic()
                if now - last_line[0] >= HEARTBEAT_S:
                    out(f"  ... {label}: still running ({fmt_seconds(now - started)} so far; log {log})")
                    last_line[0] = now

        beat = threading.Thread(target=heartbeat, name=f"heartbeat-{label}", daemon=True)
        beat.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log_file.write(line)
                if progress.search(line):
                    out(f"  {label}: {line.rstrip()}")
                    last_line[0] = time.monotonic()
            proc.wait()
        finally:
            done.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        raise StepError(
            f"{label}: `{' '.join(cmd)}` failed with exit code {proc.returncode}"
            + (f"; {hint}" if hint else "")
            + f"\nlast output ({log}):\n{build.tail(log, 30)}"
        )
    return time.monotonic() - started
