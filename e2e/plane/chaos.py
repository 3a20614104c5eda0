"""Fault injection for the chaos e2e: SIGKILL a component of a state directory, then start it again.

Every process the harness starts (etcd and the control plane, each node's driver and kubelet
stand-in, the controller replicas) has a pidfile in ``state_dir/pids`` with its command line and
log (``e2e.cluster.procs``). :class:`Restarter` works from those records:

* ``kill(name)`` sends SIGKILL to the component's process group, as a crash or an OOM kill
  would: no SIGTERM, no clean-up, no Lease released; it returns once the process is gone.
* ``start_again(record)`` starts the same command line, appending to the same log, from the
  directory the harness started it in, as kubelet restarts a crashed container (or systemd a
  control-plane unit); its pidfile is rewritten, so ``python -m e2e down`` still finds it.
* ``wait_ready(record)`` waits until the new process answers the endpoint its own command
  line names: ``/readyz`` of kube-apiserver and of the driver, ``/healthz`` of kube-scheduler,
  kube-controller-manager and the controller.

The restarted processes belong to the :class:`Restarter`: their first owner's teardown stops
only the processes it started itself (and removes their pidfiles), so ``stop(prefixes)`` must run
before that teardown, ``stop()`` for the rest before the control plane goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from e2e.cluster import controlplane, procs

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Kill:
    """One SIGKILL and restart: what, when, how long until the new process was ready."""

    component: str
    process: str
    old_pid: int
    new_pid: int = 0
    down_s: float = 0.0
    ready_s: float = 0.0


def flag(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name=value`` in ``argv`` (None when absent)."""
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in argv if a.startswith(prefix)), None)


def ready_url(record: procs.ProcessRecord) -> str | None:
    """The endpoint that says the component ``record`` names is up again, from its own flags."""
    argv = record.argv
    if record.name == "kube-apiserver":
        return f"https://127.0.0.1:{flag(argv, 'secure-port')}/readyz"
    if record.name in ("kube-scheduler", "kube-controller-manager"):
        return f"https://127.0.0.1:{flag(argv, 'secure-port')}/healthz"
    if record.name.startswith("driver-") and flag(argv, "metrics-address"):
        return f"http://{flag(argv, 'metrics-address')}/readyz"
    if record.name.startswith("controller-"):
        return flag(argv, "liveness")
    return None


def answers(url: str, timeout: float = 3.0) -> bool:
    """Whether ``url`` answers 200 (TLS unverified: loopback endpoints with self-signed certificates)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


class Restarter:
    """SIGKILLs and restarts the components recorded in ``state_dir/pids``; owns what it restarted."""

    def __init__(self, state_dir: Path, *, out: Callable[[str], None] = print) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.pid_dir = self.state_dir / "pids"
        self._out = out
        self._children: dict[str, tuple[subprocess.Popen[bytes], procs.ProcessRecord]] = {}
        self.kills: list[Kill] = []

    def record(self, name: str) -> procs.ProcessRecord:
        """The live process recorded as ``name``."""
        record = procs.read_records(self.pid_dir).get(name)
        if record is None or not procs.is_alive(record):
            raise RuntimeError(f"{name}: no live process recorded in {self.pid_dir}")
        return record

    def kill(self, name: str) -> procs.ProcessRecord:
        """SIGKILL the process group of ``name``; return its record once it is gone."""
        record = self.record(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procs.is_alive(record):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} (pid {record.pid}) survived SIGKILL for 10s")
            time.sleep(0.05)
        mine = self._children.pop(name, None)
        if mine is not None:
            mine[0].wait(timeout=5)
        return record

    def start_again(self, record: procs.ProcessRecord) -> procs.ProcessRecord:
        """Start ``record``'s command line again (same log, same directory); return the new record."""
        cwd = self.state_dir if record.name in controlplane.COMPONENTS else REPO_ROOT
        proc, new = procs.spawn(
            record.name, record.argv, log=record.log, pid_dir=self.pid_dir, cwd=cwd, die_with_parent=True
        )
        self._children[record.name] = (proc, new)
        return new

    def wait_ready(self, record: procs.ProcessRecord, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until the restarted component answers its readiness endpoint (or, without one, lives)."""
        url = ready_url(record)
        deadline = time.monotonic() + timeout
        while True:
            if not procs.is_alive(record):
                raise procs.ComponentError(record.name, "exited after its restart", record.log)
            if url is None or answers(url):
                return
            if time.monotonic() > deadline:
                raise procs.ComponentError(record.name, f"{url} not ready {timeout:.0f}s after restart", record.log)
            time.sleep(0.25)

    def crash(
        self, component: str, name: str, *, downtime_s: float = 1.0, while_down: Callable[[], object] | None = None
    ) -> Kill:
        """SIGKILL ``name``, leave it down ``downtime_s`` (a restart back-off), start it again, wait until ready.

        ``while_down`` runs right after the kill (what the test does while the component is gone)."""
        t0 = time.monotonic()
        old = self.kill(name)
        if while_down is not None:
            while_down()
        time.sleep(max(0.0, downtime_s - (time.monotonic() - t0)))
        new = self.start_again(old)
        down = time.monotonic() - t0
        self.wait_ready(new)
        kill = Kill(component, name, old.pid, new.pid, down, time.monotonic() - t0)
        self.kills.append(kill)
        self._out(
            f"[chaos] SIGKILL {name} (pid {old.pid}); restarted as pid {new.pid} after {down:.1f}s, "
            f"ready after {kill.ready_s:.1f}s"
        )
        return kill

    def stop(self, prefixes: Sequence[str] = ()) -> list[str]:
        """Stop the processes this object restarted (only those whose names start with ``prefixes``, if given).

        Control-plane components go last, kube-apiserver after the others, etcd at the very end.
        """
        order = {"etcd": 3, "kube-apiserver": 2}
        chosen = [n for n in self._children if not prefixes or n.startswith(tuple(prefixes))]
        stopped = []
        for name in sorted(chosen, key=lambda n: (order.get(n, 0), n)):
            proc, record = self._children.pop(name)
            procs.stop(record, proc)
            procs.pidfile(self.pid_dir, name).unlink(missing_ok=True)
            stopped.append(name)
        return stopped
