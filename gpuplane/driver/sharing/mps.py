"""Per-claim MPS control daemons: start, configure, find again, stop (:class:`MpsControl`).

A claim whose sharing config asks for MPS gets its own
``nvidia-cuda-mps-control`` daemon, with private directories under the plugin
dir::

    <root_dir>/<claim_uid>/
        daemon.json   what this module started (spec, pid, phase); written
                      atomically before the daemon starts and after each step
        pipe/         CUDA_MPS_PIPE_DIRECTORY: the daemon's ``control`` socket
                      and ``nvidia-cuda-mps-control.pid`` (mounted into the
                      workload containers)
        log/          CUDA_MPS_LOG_DIRECTORY: control.log, server.log
        shm/          bind-mounted as the containers' /dev/shm

How the real binary behaves (NVIDIA MPS docs, "Tools and Interface
Reference"; control.log excerpts of real daemons): ``-d`` forks a background
daemon and returns; ``-f`` runs it in the foreground; with neither flag it is
a client that reads commands on stdin and prints the daemon's replies, exiting
non-zero with "Cannot find MPS control daemon process" when no daemon answers.
The daemon writes its pid to ``nvidia-cuda-mps-control.pid`` in the pipe dir
(recent drivers) and listens on the UNIX socket ``pipe/control``, so the pipe
dir path must leave the socket path within the 107-byte AF_UNIX limit (over it
the daemon starts, fails to bind and exits). ``set_default_active_thread_percentage``
echoes the value (``25.0``); ``set_default_device_pinned_mem_limit <dev> <N>M``
takes the device ordinal within CUDA_VISIBLE_DEVICES and prints nothing; both
defaults apply to servers started afterwards and are lost on ``quit``. The
client's exit status says only whether a daemon was reached, so every setting
is verified by reading it back.

The parts: :mod:`~gpuplane.driver.sharing.mps_spec` (the values: spec, paths, what containers
get), :mod:`~gpuplane.driver.sharing.mps_daemon` (one claim's daemon and every step on its
directories), :mod:`~gpuplane.driver.sharing.mps_client` (client mode and the read-back checks),
:mod:`~gpuplane.driver.sharing.mps_procs` (``/proc`` scanning and signals). This module picks the
claim's daemon and serializes the calls.

Crash safety: the driver may be SIGKILLed at any step. Everything needed to
find a daemon again is on disk before the daemon exists (``daemon.json``, then
the pid file the daemon writes, then the daemon's environment, which names its
pipe dir), so :meth:`MpsControl.cleanup_orphans` in a new process stops daemons
of a previous life and removes half-made directories. A pid is trusted only
after ``/proc/<pid>`` shows it is a control daemon for that pipe dir (pids are
reused, and a reboot makes every recorded pid meaningless).

Where the daemon runs: as the driver's child (``-d``, the default and the host-process mode
of the kubelet stand-in nodes), or with ``pods`` (``--mps-daemons=pod``, the DaemonSet's
setting) in a Pod of its own on the node (:mod:`~gpuplane.driver.sharing.mps_pods`), so that
restarting or upgrading the driver pod leaves live claims' daemons running.

/dev/shm: MPS clients and their server share memory through /dev/shm, so the
workload containers get ``shm/`` as /dev/shm, and so does a daemon pod. On a real node the
driver can mount a private tmpfs there (``mount_shm_tmpfs=True``; done only when running
as root); it is off by default and in tests, where ``shm/`` is a plain directory. A
daemon started as the driver's child sees the driver's /dev/shm instead.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import structlog

from gpuplane.driver.sharing.mps_daemon import ClaimDaemon, DaemonSettings
from gpuplane.driver.sharing.mps_pods import DaemonPods
from gpuplane.driver.sharing.mps_procs import MpsProcesses
from gpuplane.driver.sharing.mps_spec import CLAIM_UID, DaemonPaths, MpsDaemon, MpsError, MpsSpec

log = structlog.get_logger(__name__)


class MpsControl:
    """Starts and stops per-claim MPS control daemons under ``root_dir``.

    ``control_binary`` is the real ``nvidia-cuda-mps-control`` (a name looked
    up on PATH, or a path). One instance per driver process; calls are
    serialized by an instance lock (prepare/unprepare are serialized above
    this, across processes, by the plugin's file lock).
    """

    def __init__(
        self,
        root_dir: Path,
        control_binary: str,
        start_timeout_s: float = 10.0,
        command_timeout_s: float = 10.0,
        *,
        mount_shm_tmpfs: bool = False,
        shm_size: str = "64m",
        boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id"),
        proc_root: Path = Path("/proc"),
        pods: DaemonPods | None = None,
    ) -> None:
        self._root = Path(root_dir).absolute()
        self._settings = DaemonSettings(
            binary=control_binary,
            start_timeout_s=start_timeout_s,
            command_timeout_s=command_timeout_s,
            mount_shm_tmpfs=mount_shm_tmpfs,
            shm_size=shm_size,
            boot_id_file=boot_id_file,
            pods=pods,
        )
        self._procs = MpsProcesses(Path(control_binary).name, self._root, proc_root)
        self._lock = threading.RLock()

    def _daemon(self, claim_uid: str) -> ClaimDaemon:
        return ClaimDaemon(DaemonPaths.of(self._root, claim_uid), self._settings, self._procs)

    def start(self, spec: MpsSpec) -> MpsDaemon:
        """Start and configure the claim's daemon, or return the one already running.

        Raises :class:`MpsError` if the spec is invalid, if a daemon with a
        different spec runs for the claim, or if anything fails; on failure
        nothing is left behind (daemon stopped, directories removed).
        """
        with self._lock:
            return self._daemon(spec.claim_uid).start(spec)

    def stop(self, claim_uid: str) -> None:
        """Quit the claim's daemon (escalating to signals) and remove its directories.

        No daemon and no directory: nothing to do.
        """
        with self._lock:
            self._daemon(claim_uid).teardown(quiet=False)

    def list_daemons(self) -> list[MpsDaemon]:
        """Every claim directory under the root that has a daemon record."""
        with self._lock:
            found = []
            for claim_uid in self._claim_dirs():
                daemon = self._daemon(claim_uid)
                if daemon.read_record() is None:
                    continue
                found.append(daemon.found())
            return found

    def alive(self, claim_uid: str) -> bool:
        """Whether the claim's control daemon is running."""
        with self._lock:
            return self._daemon(claim_uid).find_pid() is not None

    def cleanup_orphans(self, keep: set[str]) -> list[str]:
        """Stop daemons and remove directories of claims not in ``keep``.

        Covers claim directories (with or without a running daemon, with or
        without a readable record) and control daemons still running for a
        pipe dir under the root whose claim directory is gone. Returns the
        claim uids removed, sorted.
        """
        with self._lock:
            removed: set[str] = set()
            for claim_uid in self._claim_dirs():
                if claim_uid in keep:
                    continue
                try:
                    self._daemon(claim_uid).teardown(quiet=False)
                except MpsError as err:
                    log.error("mps orphan cleanup failed", claim_uid=claim_uid, error=str(err))
                    continue
                removed.add(claim_uid)
            for pid, pipe_dir in self._procs.scan(None):
                claim_uid = pipe_dir.parent.name
                if pipe_dir.parent.parent != self._root or claim_uid in keep:
                    continue
                log.warning("killing mps daemon without a claim dir", claim_uid=claim_uid, pid=pid)
                try:
                    self._procs.kill(pid)
                except MpsError as err:
                    log.error("mps orphan cleanup failed", claim_uid=claim_uid, error=str(err))
                    continue
                removed.add(claim_uid)
            removed |= self._orphan_pods(keep)
            if removed:
                log.info("mps orphans removed", claim_uids=sorted(removed))
            return sorted(removed)

    def _orphan_pods(self, keep: set[str]) -> set[str]:
        """Delete this node's daemon pods of claims not in ``keep`` (an older driver left them, or a crash)."""
        pods = self._settings.pods
        if pods is None:
            return set()
        removed: set[str] = set()
        try:
            orphans = sorted(set(pods.claims()) - keep)
        except Exception as err:  # the API is down: the next sweep tries again
            log.error("cannot list mps daemon pods", error=str(err))
            return removed
        for claim_uid in orphans:
            try:
                pods.remove(claim_uid)
            except Exception as err:
                log.error("mps daemon pod cleanup failed", claim_uid=claim_uid, error=str(err))
                continue
            removed.add(claim_uid)
        return removed

    def _claim_dirs(self) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self._root) if e.is_dir() and CLAIM_UID.match(e.name))
        except FileNotFoundError:
            return []
