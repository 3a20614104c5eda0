"""One claim's MPS control daemon: its directories and record, starting it, finding it again, stopping it.

:class:`ClaimDaemon` holds the claim's :class:`~gpuplane.driver.sharing.mps_spec.DaemonPaths`
and does every step on them; :class:`gpuplane.driver.sharing.mps.MpsControl` picks the daemon
and serializes the calls.

Side effects, in order, of :meth:`ClaimDaemon.start`: creates ``<root>/<claim>/`` with
``pipe/``, ``log/`` and ``shm/`` (chowned to the spec's owner), writes ``daemon.json``
(atomically, before the daemon exists and after each step: ``starting``, ``configuring``,
``ready``), mounts a tmpfs on ``shm/`` when asked and running as root, runs ``<binary> -d``
(the daemon forks away into its own session) or, with ``pods`` set, creates the claim's daemon
Pod (:mod:`~gpuplane.driver.sharing.mps_pods`: ``<binary> -f`` in a pod of its own, which
outlives the driver's container), waits for it to answer, sends the spec's defaults through
the client and reads them back. On any failure it tears down what it made.
:meth:`ClaimDaemon.teardown` sends ``quit``, escalates to SIGTERM/SIGKILL of the daemon's
process group, kills servers still naming the pipe dir, deletes the daemon Pod, unmounts
``shm/`` and removes the claim directory.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gpuplane.driver.host import atomic_write
from gpuplane.driver.sharing.backoff import Backoff
from gpuplane.driver.sharing.mps_client import MpsClient, log_tail, one_line
from gpuplane.driver.sharing.mps_pods import DaemonPods
from gpuplane.driver.sharing.mps_procs import MpsProcesses
from gpuplane.driver.sharing.mps_spec import CLIENT_PRIORITY_ENV, DaemonPaths, MpsDaemon, MpsError, MpsSpec, check_spec

log = structlog.get_logger(__name__)

RECORD_VERSION = 1


@dataclass(frozen=True)
class DaemonSettings:
    """How daemons are run, from the driver's configuration (see :class:`gpuplane.driver.sharing.mps.MpsControl`)."""

    binary: str
    start_timeout_s: float
    command_timeout_s: float
    mount_shm_tmpfs: bool
    shm_size: str
    boot_id_file: Path
    pods: DaemonPods | None = None  # None: the daemon is the driver's child (``-d``)


class ClaimDaemon:
    """The control daemon of one claim, at ``paths``."""

    def __init__(self, paths: DaemonPaths, settings: DaemonSettings, procs: MpsProcesses) -> None:
        self.paths = paths
        self.settings = settings
        self.procs = procs
        self.client = MpsClient(settings.binary, paths, settings.command_timeout_s)

    @property
    def claim_uid(self) -> str:
        return self.paths.claim_uid

    # ------------------------------------------------------------------ state

    def read_record(self) -> dict[str, Any] | None:
        """``daemon.json``, or None when missing or unreadable."""
        try:
            data = json.loads(self.paths.record.read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write_record(self, record: Mapping[str, Any]) -> None:
        atomic_write(self.paths.record, json.dumps(record, indent=1, sort_keys=True).encode())

    def find_pid(self) -> int | None:
        """The running control daemon for this pipe dir, from the most to the least direct evidence."""
        candidates: list[int] = []
        record = self.read_record()
        if record is not None and isinstance(record.get("pid"), int) and record.get("boot_id") == self._boot_id():
            candidates.append(record["pid"])
        with contextlib.suppress(OSError, ValueError):
            candidates.append(int(self.paths.pid_file.read_text().strip()))
        for pid in candidates:
            if self.procs.is_daemon_for(pid, self.paths.pipe):
                return pid
        for pid, _ in self.procs.scan(self.paths.pipe):
            return pid
        return None

    def found(self) -> MpsDaemon:
        """The daemon as it is now (``pid`` None when not running)."""
        return self.paths.daemon(self.find_pid())

    def _boot_id(self) -> str | None:
        try:
            return self.settings.boot_id_file.read_text().strip()
        except OSError:
            return None

    # --------------------------------------------------------------- starting

    def start(self, spec: MpsSpec) -> MpsDaemon:
        """Start and configure the daemon for ``spec``, or return the one already running.

        Raises :class:`MpsError` if the spec is invalid, if a daemon with a different spec runs
        for the claim, or if anything fails; on failure nothing is left behind.
        """
        check_spec(spec, self.paths)
        bound = log.bind(claim_uid=spec.claim_uid)
        existing = self._existing(spec)
        if existing is not None:
            bound.debug("mps daemon already running", pid=existing.pid)
            return existing
        bound.info("starting mps daemon", devices=list(spec.device_uuids))
        try:
            try:
                daemon = self._start_new(spec)
            except OSError as err:
                raise MpsError(f"claim {spec.claim_uid}: {err}") from err
        except BaseException as err:
            try:
                self.teardown(quiet=True)
            except MpsError as cleanup_err:
                bound.error("mps cleanup after failed start failed", error=str(cleanup_err))
            if isinstance(err, MpsError):
                bound.warning("mps daemon start failed", error=str(err))
            raise
        bound.info("mps daemon ready", pid=daemon.pid)
        return daemon

    def _existing(self, spec: MpsSpec) -> MpsDaemon | None:
        """The running, fully configured daemon for this spec; clean up anything less."""
        if not self.paths.root.exists():
            return None
        record = self.read_record()
        pid = self.find_pid()
        if record is not None and pid is not None and record.get("phase") == "ready":
            try:
                recorded = MpsSpec.from_json(record["spec"])
            except (KeyError, TypeError, ValueError):
                recorded = None
            if recorded == spec:
                return self.paths.daemon(pid)
            raise MpsError(
                f"claim {spec.claim_uid}: an MPS daemon (pid {pid}) already runs with a different spec "
                f"({json.dumps(record.get('spec'), sort_keys=True)}); stop it first"
            )
        # Half made (a crash mid-start, a dead daemon): start over.
        log.info("removing stale mps state", claim_uid=spec.claim_uid, phase=(record or {}).get("phase"))
        self.teardown(quiet=False)
        return None

    def _start_new(self, spec: MpsSpec) -> MpsDaemon:
        self._make_dirs(spec)
        record: dict[str, Any] = {
            "version": RECORD_VERSION,
            "claim_uid": spec.claim_uid,
            "spec": spec.to_json(),
            "phase": "starting",
            "pid": None,
            "boot_id": self._boot_id(),
            "control_binary": self.settings.binary,
            "shm_tmpfs": False,
            "started_at": _now(),
        }
        self._write_record(record)  # before the daemon exists: a restart knows where to look
        if self.settings.mount_shm_tmpfs:
            record["shm_tmpfs"] = self._mount_tmpfs()
            self._write_record(record)

        self._launch(spec)
        pid = self._wait_ready()
        record.update(phase="configuring", pid=pid)
        self._write_record(record)

        self.client.configure(spec)
        record.update(phase="ready", ready_at=_now())
        self._write_record(record)
        return self.paths.daemon(pid)

    def _make_dirs(self, spec: MpsSpec) -> None:
        paths = self.paths
        paths.root.parent.mkdir(parents=True, exist_ok=True)
        paths.root.mkdir(mode=0o700)
        paths.pipe.mkdir(mode=0o700)
        paths.log.mkdir(mode=0o700)
        paths.shm.mkdir(mode=0o700)
        os.chmod(paths.shm, 0o1777)  # like /dev/shm: any container user may create files
        if spec.owner_uid is not None:
            os.chmod(paths.root, 0o711)  # the owner must traverse to reach pipe/
            os.chown(paths.pipe, spec.owner_uid, -1)
            os.chown(paths.shm, spec.owner_uid, -1)

    def _launch(self, spec: MpsSpec) -> None:
        """Run ``<binary> -d`` and wait for it to return (the daemon forks away)."""
        binary, timeout_s = self.settings.binary, self.settings.start_timeout_s
        env = self.client.env()
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.device_uuids)
        if spec.client_priority is not None:  # set before the daemon starts, it is the daemon's default too
            env[CLIENT_PRIORITY_ENV] = str(spec.client_priority)
        if self.settings.pods is not None:
            self.settings.pods.launch(self.paths, env)
            return
        launcher_log = self.paths.log / "launcher.log"
        with open(launcher_log, "wb") as out:
            try:
                proc = subprocess.Popen(
                    [binary, "-d"],
                    env=env,
                    cwd=self.paths.root,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as err:
                raise MpsError(f"claim {spec.claim_uid}: cannot run {binary} -d: {err}") from err
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise MpsError(
                    f"claim {spec.claim_uid}: {binary} -d did not return within "
                    f"{timeout_s:g}s{log_tail(self.paths.log)}"
                ) from None
        if code != 0:
            raise MpsError(f"claim {spec.claim_uid}: {binary} -d exited with status {code}{log_tail(self.paths.log)}")

    def _wait_ready(self) -> int:
        """Wait until the daemon answers a query; return its pid."""
        timeout_s = self.settings.start_timeout_s
        start = time.monotonic()
        pause = Backoff(timeout_s, first_s=0.01, cap_s=0.2)
        last = "the control socket was never created"
        pods, next_pod_check = self.settings.pods, start
        while True:
            if pods is not None and time.monotonic() >= next_pod_check:
                next_pod_check = time.monotonic() + 0.5  # the API, not /proc: at most two reads a second
                why = pods.failure(self.claim_uid)
                if why is not None:
                    raise MpsError(f"claim {self.claim_uid}: the MPS control daemon did not start: {why}")
            if not self.paths.control.exists():
                # -d returned 0, but a daemon that cannot bind exits right after: fail fast.
                # (A pod's container takes seconds to start; its pod status says when it ended.)
                if pods is None and time.monotonic() - start > min(1.0, timeout_s / 2) and self.find_pid() is None:
                    raise MpsError(
                        f"claim {self.claim_uid}: the MPS control daemon exited right after starting"
                        f"{log_tail(self.paths.log)}"
                    )
            else:
                answered, why = self.client.answers()
                if answered:
                    pid = self.find_pid()
                    if pid is not None:
                        return pid
                    last = "the daemon answered but its process was not found"
                elif why:
                    last = why
            if not pause.wait():
                raise MpsError(
                    f"claim {self.claim_uid}: MPS control daemon not ready within "
                    f"{timeout_s:g}s ({last}){log_tail(self.paths.log)}"
                )

    def _mount_tmpfs(self) -> bool:
        shm = self.paths.shm
        if os.geteuid() != 0:
            log.warning("not root: shm dir stays a plain directory", shm_dir=str(shm))
            return False
        options = f"rw,nosuid,nodev,noexec,mode=1777,size={self.settings.shm_size}"
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(shm)],
            capture_output=True,
            text=True,
            timeout=self.settings.command_timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise MpsError(f"cannot mount a tmpfs on {shm}: {one_line(result.stderr or result.stdout)}")
        return True

    # --------------------------------------------------------------- stopping

    def teardown(self, *, quiet: bool) -> None:
        """Stop whatever daemon runs for the claim and remove its directory."""
        paths = self.paths
        pid = self.find_pid()
        if pid is not None:
            self._quit(pid)
        # Servers and stray daemons that still name this pipe dir (e.g. a second
        # daemon whose pid was never recorded).
        for other, _ in self.procs.scan(paths.pipe, servers=True):
            self.procs.kill(other)
        if self.settings.pods is not None:
            self.settings.pods.remove(self.claim_uid)
        if paths.shm.is_dir() and os.path.ismount(paths.shm):
            _unmount(paths.shm)
        if paths.root.exists():
            try:
                shutil.rmtree(paths.root, ignore_errors=quiet)
            except OSError as err:
                raise MpsError(f"claim {self.claim_uid}: cannot remove {paths.root}: {err}") from err
            if not quiet:
                log.info("mps claim dir removed", claim_uid=self.claim_uid)

    def _quit(self, pid: int) -> None:
        """``quit`` through client mode, then SIGTERM, then SIGKILL the daemon's group."""
        try:
            self.client.run("quit")
        except MpsError as err:
            log.warning("mps quit failed", claim_uid=self.claim_uid, error=str(err))
        if self.procs.wait_gone(pid, self.settings.command_timeout_s):
            return
        log.warning("mps daemon ignored quit; signalling", claim_uid=self.claim_uid, pid=pid)
        self.procs.kill(pid)


def _unmount(shm: Path) -> None:
    for args in (["umount", str(shm)], ["umount", "-l", str(shm)]):
        result = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        if result.returncode == 0:
            return
    raise MpsError(f"cannot unmount {shm}")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()
