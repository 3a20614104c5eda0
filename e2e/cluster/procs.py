"""Component processes: start in their own session, track by pidfile, stop for sure.

Each component runs as the leader of a new session (so of a new process
group), with stdout and stderr going to a log file. A pidfile records its pid
and kernel start time; ``down`` in another Python process uses it to stop the
right process even if the pid has since been reused. Stopping sends SIGTERM
to the process group, waits, then sends SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

TERM_GRACE_S = 10.0
KILL_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
# Words in a log line that point at why a component failed to start.
_FAILURE_WORDS = re.compile(
    r"address already in use|unrecognized|unknown (?:feature|flag)|invalid|error|fatal|failed|panic|cannot",
    re.IGNORECASE,
)


@dataclasses.dataclass(frozen=True)
class ProcessRecord:
    """What a pidfile says about one running component."""

    name: str
    pid: int
    start_ticks: int
    log: Path
    argv: tuple[str, ...]

    def to_json(self) -> str:
        """Serialize for a pidfile."""
        return json.dumps(
            {
                "name": self.name,
                "pid": self.pid,
                "start_ticks": self.start_ticks,
                "log": str(self.log),
                "argv": list(self.argv),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ProcessRecord:
        """Parse a pidfile."""
        data = json.loads(text)
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            log=Path(data["log"]),
            argv=tuple(str(a) for a in data["argv"]),
        )


class ComponentError(RuntimeError):
    """A component failed to start or become ready; the message carries its log tail."""

    def __init__(self, name: str, problem: str, log: Path) -> None:
        self.name = name
        self.log = log
        super().__init__(f"{name}: {problem}\n{describe_log(log)}")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name sits in parentheses and may itself contain spaces.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Kernel start time of ``pid`` in clock ticks, or None if it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(record: ProcessRecord) -> bool:
    """Whether the process the record names still runs (same pid and start time, not a zombie)."""
    fields = _stat_fields(record.pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == record.start_ticks


def pidfile(pid_dir: Path, name: str) -> Path:
    """Path of the pidfile for component ``name``."""
    return pid_dir / f"{name}.json"


def read_records(pid_dir: Path) -> dict[str, ProcessRecord]:
    """Every readable pidfile in ``pid_dir``, by component name."""
    records: dict[str, ProcessRecord] = {}
    if not pid_dir.is_dir():
        return records
    for path in sorted(pid_dir.glob("*.json")):
        try:
            record = ProcessRecord.from_json(path.read_text())
        except (OSError, ValueError, KeyError):
            continue
        records[record.name] = record
    return records


def _die_with(parent: int) -> Callable[[], None]:
    """A preexec function: have the kernel SIGKILL the child when ``parent`` exits (Linux).

    ``prctl`` is looked up here, before the fork, so the child only makes the call.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    pid_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start ``argv`` in a new session, logging to ``log``, and write its pidfile.

    ``die_with_parent`` makes the kernel kill the process if this Python process
    dies without cleaning up (test runs); leave it off for components that must
    outlive their starter (``python -m e2e up``).
    """
    binary = Path(argv[0])
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise FileNotFoundError(f"{name}: binary {binary} is missing or not executable (run `python -m e2e build`)")
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_dir.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as log_file:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Only async-signal-safe work in the child: a prctl looked up before the fork.
            preexec_fn=_die_with(os.getpid()) if die_with_parent else None,  # noqa: PLW1509
            env=None if env is None else dict(env),
            cwd=cwd,
            close_fds=True,
        )
    ticks = start_ticks(proc.pid)
    record = ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks or 0, log=log, argv=tuple(argv))
    path = pidfile(pid_dir, name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(record.to_json())
    os.replace(tmp, path)
    return proc, record


def _wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop(
    record: ProcessRecord,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    term_grace: float = TERM_GRACE_S,
) -> None:
    """Stop the component's process group: SIGTERM, wait, then SIGKILL.

    Pass ``proc`` when this process started it, so that it is reaped.
    """

    def gone() -> bool:
        if proc is not None:
            return proc.poll() is not None
        return not is_alive(record)

    if not gone():
        # Our components lead their own group (start_new_session), so pgid == pid.
        _signal_group(record.pid, signal.SIGTERM)
        if not _wait_until(gone, term_grace):
            _signal_group(record.pid, signal.SIGKILL)
            _wait_until(gone, KILL_GRACE_S)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=KILL_GRACE_S)


def log_tail(log: Path, lines: int = 30) -> list[str]:
    """The last ``lines`` lines of a log file."""
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def describe_log(log: Path, lines: int = 30) -> str:
    """The log's likely failure lines first, then its tail, for an exception message."""
    tail = log_tail(log, lines)
    if not tail:
        return f"(log {log} is empty or missing)"
    suspicious = [line for line in tail if _FAILURE_WORDS.search(line)][-8:]
    parts = []
    if suspicious:
        parts.append("likely cause:\n  " + "\n  ".join(suspicious))
    parts.append(f"last {len(tail)} lines of {log}:\n  " + "\n  ".join(tail))
    return "\n".join(parts)
