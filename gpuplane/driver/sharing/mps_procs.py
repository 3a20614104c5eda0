"""MPS processes in the process table: find a claim's control daemon and servers, and stop them.

A pid is trusted only after ``/proc/<pid>`` shows the right program (the control binary, or
``nvidia-cuda-mps-server``) with ``CUDA_MPS_PIPE_DIRECTORY`` naming the claim's pipe dir: pids
are reused, and the daemon's environment is the one piece of evidence that survives a driver
restart. Reads ``/proc`` (through :mod:`gpuplane.driver.host`); :meth:`MpsProcesses.kill`
signals a process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from gpuplane.driver.host import proc_cmdline, proc_environ, proc_pids, proc_running
from gpuplane.driver.sharing.backoff import Backoff
from gpuplane.driver.sharing.mps_spec import MpsError

MPS_SERVER_BINARY = "nvidia-cuda-mps-server"


class MpsProcesses:
    """The control daemons (and MPS servers) of pipe dirs under ``root_dir``, as ``/proc`` shows them."""

    def __init__(self, binary_name: str, root_dir: Path, proc_root: Path) -> None:
        self._binary_name = binary_name
        self._root = root_dir
        self._proc = proc_root

    def running(self, pid: int) -> bool:
        return proc_running(pid, self._proc)

    def process(self, pid: int) -> tuple[str, str | None] | None:
        """(program name, CUDA_MPS_PIPE_DIRECTORY) of a live MPS process, or None."""
        if not self.running(pid):
            return None
        argv = proc_cmdline(pid, self._proc)
        if argv is None:
            return None
        # The program is argv[0], or argv[1] for a script run by an interpreter.
        names = [a.rsplit("/", 1)[-1] for a in argv[:2] if a]
        program = next((n for n in names if n in (self._binary_name, MPS_SERVER_BINARY)), None)
        if program is None:
            return None
        return (program, proc_environ(pid, "CUDA_MPS_PIPE_DIRECTORY", self._proc))

    def is_daemon_for(self, pid: int, pipe: Path) -> bool:
        """Whether ``pid`` is a live control daemon serving ``pipe``."""
        info = self.process(pid)
        return info is not None and info[0] == self._binary_name and info[1] == str(pipe)

    def scan(self, pipe: Path | None, *, servers: bool = False) -> Iterator[tuple[int, Path]]:
        """Live control daemons (and MPS servers if asked) for ``pipe``, or any pipe dir under the root."""
        me = os.getpid()
        for pid in proc_pids(self._proc):
            if pid == me:
                continue
            info = self.process(pid)
            if info is None:
                continue
            program, pipe_dir = info
            if pipe_dir is None:
                continue
            if program != self._binary_name and not (servers and program == MPS_SERVER_BINARY):
                continue
            if (pipe is None and Path(pipe_dir).parent.parent == self._root) or pipe_dir == str(pipe):
                yield pid, Path(pipe_dir)

    def wait_gone(self, pid: int, timeout_s: float) -> bool:
        """Wait until ``pid`` is no longer running; False on timeout."""
        pause = Backoff(timeout_s, first_s=0.01, cap_s=0.1)
        while self.running(pid):
            if not pause.wait():
                return False
        return True

    def kill(self, pid: int) -> None:
        """SIGTERM then SIGKILL a daemon and its process group (it is a session leader)."""
        for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid) == pid
                send = os.killpg if group else os.kill
                send(pid, sig)
                if sig == signal.SIGTERM:
                    send(pid, signal.SIGCONT)  # a stopped daemon must run to act on SIGTERM
            if self.wait_gone(pid, wait_s):
                return
        raise MpsError(f"MPS control daemon pid {pid} survived SIGKILL")
