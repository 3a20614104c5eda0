"""The host's files and process table: atomic file writes, file locks, and ``/proc/<pid>`` read once.

Every durable file the driver keeps (the checkpoint, CDI specs, MPS daemon records, remembered
health, the simulator's state) is written with :func:`atomic_write`; the two cross-process locks
(prepare/unprepare, the simulator's state) are :func:`file_lock`; everything that asks the kernel
about a process (the MPS daemon finder, telemetry's process attribution) reads
``/proc/<pid>`` through :func:`proc_stat`, :func:`proc_cmdline` and :func:`proc_environ`.

Side effects: :func:`atomic_write` creates the parent directory, a temporary file beside the
target (removed on failure), and replaces the target; :func:`file_lock` creates the lock file
if missing. The ``/proc`` readers only read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def atomic_write(path: Path, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old content or the new, never a part.

    Temp file beside the target, fsync, rename over the target, fsync the directory (``durable``
    False skips both fsyncs: atomic against readers, not against a power cut).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            os.write(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextlib.contextmanager
def file_lock(path: Path, *, shared: bool = False, mode: int = 0o600) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (exclusive, or shared with other readers) across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the driver uses."""

    state: str  # R, S, D, Z (zombie), X (dead), ...
    ppid: int

    @property
    def running(self) -> bool:
        """Alive: neither a zombie nor dead."""
        return self.state not in ("Z", "X")


def proc_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """``/proc/<pid>/stat`` parsed (None when the process is gone or the file is malformed)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name sits in parentheses and may itself contain spaces and parentheses.
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return ProcStat(state=fields[0], ppid=int(fields[1]))
    except (IndexError, ValueError):
        return None


def proc_running(pid: int, proc: Path = PROC) -> bool:
    """Whether ``pid`` exists and is neither a zombie nor dead."""
    stat = proc_stat(pid, proc)
    return stat is not None and stat.running


def proc_cmdline(pid: int, proc: Path = PROC) -> list[str] | None:
    """The process's argv (None when unreadable)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [os.fsdecode(a) for a in raw.split(b"\0")]


def proc_environ(pid: int, name: str, proc: Path = PROC) -> str | None:
    """One variable of the process's environment at exec time (None when unset or unreadable)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = os.fsencode(name) + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return os.fsdecode(entry[len(prefix) :])
    return None


def proc_pids(proc: Path = PROC) -> list[int]:
    """Every pid in the process table (empty when ``proc`` cannot be listed)."""
    try:
        return [int(e.name) for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return []
