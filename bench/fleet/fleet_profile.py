"""Where a live process's CPU goes: a py-spy recording, summarised by function.

``start(pid, seconds)`` records in the background (py-spy ``--nonblocking``: the process is not
paused), ``summary(recording)`` waits for it and lists the functions that were on the stack of
most samples (inclusive) and those that were running (self). Idle samples are left out by py-spy,
so the busy share is samples / (rate x seconds). Without py-spy installed (``pip install py-spy``)
the summary says so and the bench goes on.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

RATE = 50  # samples per second
_LINE = re.compile(r":\d+\)$")
# Frames every sample of an event-loop process has (the loop, threads, the entry point): not listed.
_PLUMBING = re.compile(r"[(/](asyncio|concurrent)/|[(/](threading|runpy|selectors)\.py\)$|^<module> ")


@dataclass
class Recording:
    """A py-spy recording under way (or why there is none)."""

    seconds: float
    proc: subprocess.Popen[bytes] | None
    path: Path
    why_not: str = ""


def _py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def start(pid: int, seconds: float) -> Recording:
    """Start recording ``pid`` for ``seconds`` in the background."""
    path = Path(tempfile.mkstemp(prefix=f"py-spy-{pid}-", suffix=".txt")[1])
    exe = _py_spy()
    if exe is None:
        return Recording(seconds, None, path, "py-spy is not installed (pip install py-spy): no profile")
    cmd = [exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(RATE), "-f", "raw", "-o", str(path)]
    proc = subprocess.Popen([*cmd, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return Recording(seconds, proc, path)


def parse(text: str) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """Samples, and per function (``name (file)``, line numbers dropped) its inclusive and self counts."""
    total, inclusive, own = 0, collections.Counter[str](), collections.Counter[str]()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        total += n
        for f in set(frames):
            inclusive[f] += n
        own[frames[-1]] += n
    return total, inclusive, own


def summary(rec: Recording, top: int = 25) -> str:
    """Wait for the recording; a text table of where the time went."""
    if rec.proc is None:
        return rec.why_not
    try:
        _, err = rec.proc.communicate(timeout=rec.seconds + 60)
    except subprocess.TimeoutExpired:
        rec.proc.kill()
        return f"py-spy did not finish within {rec.seconds + 60:.0f} s"
    text = rec.path.read_text() if rec.path.exists() else ""
    rec.path.unlink(missing_ok=True)
    total, inclusive, own = parse(text)
    if not total:
        return f"py-spy recorded nothing (exit {rec.proc.returncode}): {err.decode(errors='replace')[-300:]}"
    busy = total / (RATE * rec.seconds)
    out = [f"{total} samples in {rec.seconds:.0f} s at {RATE}/s: busy {100 * busy:.0f} % of one CPU"]
    out.append("\ninclusive % (on the stack)   self % (running)   function (file)")
    listed = [(name, n) for name, n in inclusive.most_common() if not _PLUMBING.search(name)][:top]
    for name, n in listed:
        out.append(f"{100 * n / total:>10.1f} {100 * own.get(name, 0) / total:>20.1f}   {name}")
    out.append("\nmost self time:")
    for name, n in own.most_common(10):
        out.append(f"{100 * n / total:>10.1f}   {name}")
    return "\n".join(out)
