"""Per-claim MPS control daemons: start, configure, find again, stop.

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

Crash safety: the driver may be SIGKILLed at any step. Everything needed to
find a daemon again is on disk before the daemon exists (``daemon.json``, then
the pid file the daemon writes, then the daemon's environment, which names its
pipe dir), so :meth:`MpsControl.cleanup_orphans` in a new process stops daemons
of a previous life and removes half-made directories. A pid is trusted only
after ``/proc/<pid>`` shows it is a control daemon for that pipe dir (pids are
reused, and a reboot makes every recorded pid meaningless).

/dev/shm: MPS clients and their server share memory through /dev/shm, so the
workload containers get ``shm/`` as /dev/shm. On a real node the driver can
mount a private tmpfs there (``mount_shm_tmpfs=True``; done only when running
as root); it is off by default and in tests, where ``shm/`` is a plain
directory. The daemon itself is started in the driver's mount namespace: for
the server to see the same /dev/shm as the containers, the driver pod must
itself see ``shm/`` as its /dev/shm for that daemon (a node-level deployment
concern, not handled here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import structlog

from gpuplane.driver.host import atomic_write, proc_cmdline, proc_environ, proc_pids, proc_running

log = structlog.get_logger(__name__)

CONTAINER_PIPE_DIR = "/run/gpuplane/mps/pipe"
"""Where the claim's pipe dir appears inside its containers."""
CONTAINER_SHM_DIR = "/dev/shm"
"""Where the claim's shm dir appears inside its containers."""

RECORD_FILE = "daemon.json"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET = "control"
RECORD_VERSION = 1
MAX_SOCKET_PATH = 107  # bytes in sockaddr_un.sun_path, less the terminating NUL
MIB = 1024 * 1024
MPS_SERVER_BINARY = "nvidia-cuda-mps-server"

_CLAIM_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MEM_REPLY = re.compile(r"^(\d+)([MG])$")
_BIND_OPTIONS = ("rw", "nosuid", "nodev", "bind")


class MpsError(Exception):
    """An MPS daemon could not be started, configured or stopped."""


@dataclasses.dataclass(frozen=True)
class MpsSpec:
    """What one claim's MPS daemon must look like.

    ``device_uuids`` are GPU or MIG UUIDs in CUDA device order: they become
    CUDA_VISIBLE_DEVICES, and ordinal i in the pinned-memory commands is
    ``device_uuids[i]``. ``pinned_memory_limits`` maps some of those UUIDs to
    a per-client limit in bytes (sent in whole MiB, rounded down).
    ``owner_uid``, if set, owns the pipe and shm dirs (a non-root workload
    must be able to reach the control socket).
    """

    claim_uid: str
    device_uuids: tuple[str, ...]
    active_thread_percentage: int | None
    pinned_memory_limits: Mapping[str, int]
    owner_uid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "claim_uid": self.claim_uid,
            "device_uuids": list(self.device_uuids),
            "active_thread_percentage": self.active_thread_percentage,
            "pinned_memory_limits": dict(sorted(self.pinned_memory_limits.items())),
            "owner_uid": self.owner_uid,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MpsSpec:
        pct = data.get("active_thread_percentage")
        owner = data.get("owner_uid")
        return cls(
            claim_uid=str(data["claim_uid"]),
            device_uuids=tuple(str(u) for u in data["device_uuids"]),
            active_thread_percentage=None if pct is None else int(pct),
            pinned_memory_limits={str(k): int(v) for k, v in dict(data["pinned_memory_limits"]).items()},
            owner_uid=None if owner is None else int(owner),
        )


@dataclasses.dataclass(frozen=True)
class Mount:
    """A bind mount for a container: host path → container path (CDI-shaped)."""

    host_path: Path
    container_path: str
    options: tuple[str, ...] = _BIND_OPTIONS


@dataclasses.dataclass(frozen=True)
class MpsDaemon:
    """A claim's control daemon as found on disk; ``pid`` is None when it is not running."""

    claim_uid: str
    root: Path
    pipe_dir: Path
    log_dir: Path
    shm_dir: Path
    pid: int | None

    def container_env(self) -> dict[str, str]:
        """Environment the claim's containers need to reach this daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR}

    def container_mounts(self) -> list[Mount]:
        """The pipe dir (socket to the daemon) and the shared /dev/shm."""
        return [
            Mount(self.pipe_dir, CONTAINER_PIPE_DIR),
            Mount(self.shm_dir, CONTAINER_SHM_DIR),
        ]


@dataclasses.dataclass(frozen=True)
class _Paths:
    root: Path
    pipe: Path
    log: Path
    shm: Path

    @property
    def record(self) -> Path:
        return self.root / RECORD_FILE

    @property
    def pid_file(self) -> Path:
        return self.pipe / PID_FILE

    @property
    def control(self) -> Path:
        return self.pipe / CONTROL_SOCKET


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
    ) -> None:
        self._root = Path(root_dir).absolute()
        self._binary = control_binary
        self._binary_name = Path(control_binary).name
        self._start_timeout_s = start_timeout_s
        self._command_timeout_s = command_timeout_s
        self._mount_shm_tmpfs = mount_shm_tmpfs
        self._shm_size = shm_size
        self._boot_id_file = boot_id_file
        self._proc = proc_root
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ public

    def start(self, spec: MpsSpec) -> MpsDaemon:
        """Start and configure the claim's daemon, or return the one already running.

        Raises :class:`MpsError` if the spec is invalid, if a daemon with a
        different spec runs for the claim, or if anything fails; on failure
        nothing is left behind (daemon stopped, directories removed).
        """
        with self._lock:
            paths = self._paths(spec.claim_uid)
            self._validate(spec, paths)
            bound = log.bind(claim_uid=spec.claim_uid)
            existing = self._existing(spec, paths)
            if existing is not None:
                bound.debug("mps daemon already running", pid=existing.pid)
                return existing
            bound.info("starting mps daemon", devices=list(spec.device_uuids))
            try:
                try:
                    daemon = self._start_new(spec, paths)
                except OSError as err:
                    raise MpsError(f"claim {spec.claim_uid}: {err}") from err
            except BaseException as err:
                try:
                    self._teardown(spec.claim_uid, paths, quiet=True)
                except MpsError as cleanup_err:
                    bound.error("mps cleanup after failed start failed", error=str(cleanup_err))
                if isinstance(err, MpsError):
                    bound.warning("mps daemon start failed", error=str(err))
                raise
            bound.info("mps daemon ready", pid=daemon.pid)
            return daemon

    def stop(self, claim_uid: str) -> None:
        """Quit the claim's daemon (escalating to signals) and remove its directories.

        No daemon and no directory: nothing to do.
        """
        with self._lock:
            paths = self._paths(claim_uid)
            self._teardown(claim_uid, paths, quiet=False)

    def list_daemons(self) -> list[MpsDaemon]:
        """Every claim directory under the root that has a daemon record."""
        with self._lock:
            found = []
            for claim_uid in self._claim_dirs():
                paths = self._paths(claim_uid)
                if self._read_record(paths) is None:
                    continue
                found.append(self._daemon(claim_uid, paths, self._find_pid(paths)))
            return found

    def alive(self, claim_uid: str) -> bool:
        """Whether the claim's control daemon is running."""
        with self._lock:
            return self._find_pid(self._paths(claim_uid)) is not None

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
                    self._teardown(claim_uid, self._paths(claim_uid), quiet=False)
                except MpsError as err:
                    log.error("mps orphan cleanup failed", claim_uid=claim_uid, error=str(err))
                    continue
                removed.add(claim_uid)
            for pid, pipe_dir in self._scan_processes(None):
                claim_uid = pipe_dir.parent.name
                if pipe_dir.parent.parent != self._root or claim_uid in keep:
                    continue
                log.warning("killing mps daemon without a claim dir", claim_uid=claim_uid, pid=pid)
                try:
                    self._kill(pid)
                except MpsError as err:
                    log.error("mps orphan cleanup failed", claim_uid=claim_uid, error=str(err))
                    continue
                removed.add(claim_uid)
            if removed:
                log.info("mps orphans removed", claim_uids=sorted(removed))
            return sorted(removed)

    # --------------------------------------------------------------- starting

    def _existing(self, spec: MpsSpec, paths: _Paths) -> MpsDaemon | None:
        """The running, fully configured daemon for this spec; clean up anything less."""
        if not paths.root.exists():
            return None
        record = self._read_record(paths)
        pid = self._find_pid(paths)
        if record is not None and pid is not None and record.get("phase") == "ready":
            try:
                recorded = MpsSpec.from_json(record["spec"])
            except (KeyError, TypeError, ValueError):
                recorded = None
            if recorded == spec:
                return self._daemon(spec.claim_uid, paths, pid)
            raise MpsError(
                f"claim {spec.claim_uid}: an MPS daemon (pid {pid}) already runs with a different spec "
                f"({json.dumps(record.get('spec'), sort_keys=True)}); stop it first"
            )
        # Half made (a crash mid-start, a dead daemon): start over.
        log.info("removing stale mps state", claim_uid=spec.claim_uid, phase=(record or {}).get("phase"))
        self._teardown(spec.claim_uid, paths, quiet=False)
        return None

    def _start_new(self, spec: MpsSpec, paths: _Paths) -> MpsDaemon:
        self._make_dirs(spec, paths)
        record: dict[str, Any] = {
            "version": RECORD_VERSION,
            "claim_uid": spec.claim_uid,
            "spec": spec.to_json(),
            "phase": "starting",
            "pid": None,
            "boot_id": self._boot_id(),
            "control_binary": self._binary,
            "shm_tmpfs": False,
            "started_at": _now(),
        }
        self._write_record(paths, record)  # before the daemon exists: a restart knows where to look
        if self._mount_shm_tmpfs:
            record["shm_tmpfs"] = self._mount_tmpfs(paths.shm)
            self._write_record(paths, record)

        self._launch(spec, paths)
        pid = self._wait_ready(paths)
        record.update(phase="configuring", pid=pid)
        self._write_record(paths, record)

        self._configure(spec, paths)
        record.update(phase="ready", ready_at=_now())
        self._write_record(paths, record)
        return self._daemon(spec.claim_uid, paths, pid)

    def _make_dirs(self, spec: MpsSpec, paths: _Paths) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        paths.root.mkdir(mode=0o700)
        paths.pipe.mkdir(mode=0o700)
        paths.log.mkdir(mode=0o700)
        paths.shm.mkdir(mode=0o700)
        os.chmod(paths.shm, 0o1777)  # like /dev/shm: any container user may create files
        if spec.owner_uid is not None:
            os.chmod(paths.root, 0o711)  # the owner must traverse to reach pipe/
            os.chown(paths.pipe, spec.owner_uid, -1)
            os.chown(paths.shm, spec.owner_uid, -1)

    def _launch(self, spec: MpsSpec, paths: _Paths) -> None:
        """Run ``<binary> -d`` and wait for it to return (the daemon forks away)."""
        env = self._env(paths)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.device_uuids)
        launcher_log = paths.log / "launcher.log"
        with open(launcher_log, "wb") as out:
            try:
                proc = subprocess.Popen(
                    [self._binary, "-d"],
                    env=env,
                    cwd=paths.root,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as err:
                raise MpsError(f"claim {spec.claim_uid}: cannot run {self._binary} -d: {err}") from err
            try:
                code = proc.wait(timeout=self._start_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise MpsError(
                    f"claim {spec.claim_uid}: {self._binary} -d did not return within "
                    f"{self._start_timeout_s:g}s{self._log_tail(paths)}"
                ) from None
        if code != 0:
            raise MpsError(
                f"claim {spec.claim_uid}: {self._binary} -d exited with status {code}{self._log_tail(paths)}"
            )

    def _wait_ready(self, paths: _Paths) -> int:
        """Wait until the daemon answers a query; return its pid."""
        start = time.monotonic()
        deadline = start + self._start_timeout_s
        last = "the control socket was never created"
        delay = 0.01
        while True:
            if not paths.control.exists():
                # -d returned 0, but a daemon that cannot bind exits right after: fail fast.
                if time.monotonic() - start > min(1.0, self._start_timeout_s / 2) and self._find_pid(paths) is None:
                    raise MpsError(
                        f"claim {paths.root.name}: the MPS control daemon exited right after starting"
                        f"{self._log_tail(paths)}"
                    )
            else:
                result = self._client_raw(paths, "get_default_active_thread_percentage")
                if result is not None and result.returncode == 0 and _parse_float(result.stdout) is not None:
                    pid = self._find_pid(paths)
                    if pid is not None:
                        return pid
                    last = "the daemon answered but its process was not found"
                elif result is not None:
                    last = f"a query got status {result.returncode}: {_one_line(result.stdout + result.stderr)}"
            if time.monotonic() >= deadline:
                raise MpsError(
                    f"claim {paths.root.name}: MPS control daemon not ready within "
                    f"{self._start_timeout_s:g}s ({last}){self._log_tail(paths)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _configure(self, spec: MpsSpec, paths: _Paths) -> None:
        """Send the defaults through client mode and read each one back."""
        claim = spec.claim_uid
        pct = spec.active_thread_percentage
        if pct is not None:
            reply = self._client(paths, f"set_default_active_thread_percentage {pct}")
            if _parse_float(reply) != float(pct):
                raise MpsError(
                    f"claim {claim}: set_default_active_thread_percentage {pct} was refused: "
                    f"{_one_line(reply)!r}{self._log_tail(paths)}"
                )
            reply = self._client(paths, "get_default_active_thread_percentage")
            if _parse_float(reply) != float(pct):
                raise MpsError(
                    f"claim {claim}: active thread percentage reads back as {_one_line(reply)!r}, "
                    f"not {pct}{self._log_tail(paths)}"
                )
        for index, uuid in enumerate(spec.device_uuids):
            limit = spec.pinned_memory_limits.get(uuid)
            if limit is None:
                continue
            mib = limit // MIB
            command = f"set_default_device_pinned_mem_limit {index} {mib}M"
            answer = self._client(paths, command)  # prints nothing when accepted
            reply = self._client(paths, f"get_default_device_pinned_mem_limit {index}")
            if not _mem_reply_matches(reply, mib):
                raise MpsError(
                    f"claim {claim}: {command} ({uuid}) did not take: it answered {_one_line(answer)!r} "
                    f"and the limit reads back as {_one_line(reply)!r}{self._log_tail(paths)}"
                )

    def _mount_tmpfs(self, shm: Path) -> bool:
        if os.geteuid() != 0:
            log.warning("not root: shm dir stays a plain directory", shm_dir=str(shm))
            return False
        options = f"rw,nosuid,nodev,noexec,mode=1777,size={self._shm_size}"
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(shm)],
            capture_output=True,
            text=True,
            timeout=self._command_timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise MpsError(f"cannot mount a tmpfs on {shm}: {_one_line(result.stderr or result.stdout)}")
        return True

    # --------------------------------------------------------------- stopping

    def _teardown(self, claim_uid: str, paths: _Paths, *, quiet: bool) -> None:
        """Stop whatever daemon runs for the claim and remove its directory."""
        pid = self._find_pid(paths)
        if pid is not None:
            self._quit(paths, pid)
        # Servers and stray daemons that still name this pipe dir (e.g. a second
        # daemon whose pid was never recorded).
        for other, _ in self._scan_processes(paths.pipe, servers=True):
            self._kill(other)
        if paths.shm.is_dir() and os.path.ismount(paths.shm):
            self._unmount(paths.shm)
        if paths.root.exists():
            try:
                shutil.rmtree(paths.root, ignore_errors=quiet)
            except OSError as err:
                raise MpsError(f"claim {claim_uid}: cannot remove {paths.root}: {err}") from err
            if not quiet:
                log.info("mps claim dir removed", claim_uid=claim_uid)

    def _quit(self, paths: _Paths, pid: int) -> None:
        """``quit`` through client mode, then SIGTERM, then SIGKILL the daemon's group."""
        try:
            self._client_raw(paths, "quit")
        except MpsError as err:
            log.warning("mps quit failed", claim_uid=paths.root.name, error=str(err))
        if self._wait_gone(pid, self._command_timeout_s):
            return
        log.warning("mps daemon ignored quit; signalling", claim_uid=paths.root.name, pid=pid)
        self._kill(pid)

    def _kill(self, pid: int) -> None:
        """SIGTERM then SIGKILL a daemon and its process group (it is a session leader)."""
        for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid) == pid
                send = os.killpg if group else os.kill
                send(pid, sig)
                if sig == signal.SIGTERM:
                    send(pid, signal.SIGCONT)  # a stopped daemon must run to act on SIGTERM
            if self._wait_gone(pid, wait_s):
                return
        raise MpsError(f"MPS control daemon pid {pid} survived SIGKILL")

    def _unmount(self, shm: Path) -> None:
        for args in (["umount", str(shm)], ["umount", "-l", str(shm)]):
            result = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
            if result.returncode == 0:
                return
        raise MpsError(f"cannot unmount {shm}")

    def _wait_gone(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while self._running(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return True

    # ---------------------------------------------------------- client mode

    def _client(self, paths: _Paths, command: str) -> str:
        """Send one command; return the reply. A daemon that cannot be reached is an error."""
        result = self._client_raw(paths, command)
        if result is None or result.returncode != 0:
            detail = (
                "no answer"
                if result is None
                else f"status {result.returncode}: " + _one_line(result.stdout + result.stderr)
            )
            raise MpsError(f"claim {paths.root.name}: {command!r} failed ({detail}){self._log_tail(paths)}")
        return result.stdout.strip()

    def _client_raw(self, paths: _Paths, command: str) -> subprocess.CompletedProcess[str] | None:
        """Run the binary in client mode with ``command`` on stdin; None on timeout."""
        try:
            return subprocess.run(
                [self._binary],
                input=command + "\n",
                env=self._env(paths),
                cwd=paths.root if paths.root.is_dir() else "/",
                capture_output=True,
                text=True,
                timeout=self._command_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None
        except OSError as err:
            raise MpsError(f"cannot run {self._binary}: {err}") from err

    def _env(self, paths: _Paths) -> dict[str, str]:
        """A clean environment: nothing of the driver's own CUDA_* settings leaks in."""
        return {
            "PATH": os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            "CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(paths.log),
        }

    # ------------------------------------------------------ finding daemons

    def _find_pid(self, paths: _Paths) -> int | None:
        """The running control daemon for this pipe dir, from the most to the least direct evidence."""
        candidates: list[int] = []
        record = self._read_record(paths)
        if record is not None and isinstance(record.get("pid"), int) and record.get("boot_id") == self._boot_id():
            candidates.append(record["pid"])
        with contextlib.suppress(OSError, ValueError):
            candidates.append(int(paths.pid_file.read_text().strip()))
        for pid in candidates:
            if self._is_daemon_for(pid, paths.pipe):
                return pid
        for pid, _ in self._scan_processes(paths.pipe):
            return pid
        return None

    def _is_daemon_for(self, pid: int, pipe: Path) -> bool:
        info = self._process(pid)
        return info is not None and info[0] == self._binary_name and info[1] == str(pipe)

    def _running(self, pid: int) -> bool:
        return proc_running(pid, self._proc)

    def _process(self, pid: int) -> tuple[str, str | None] | None:
        """(program name, CUDA_MPS_PIPE_DIRECTORY) of a live process, or None."""
        if not self._running(pid):
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

    def _scan_processes(self, pipe: Path | None, *, servers: bool = False) -> Iterator[tuple[int, Path]]:
        """Live control daemons (and MPS servers if asked) for ``pipe``, or any pipe dir under the root."""
        me = os.getpid()
        for pid in proc_pids(self._proc):
            if pid == me:
                continue
            info = self._process(pid)
            if info is None:
                continue
            program, pipe_dir = info
            if pipe_dir is None:
                continue
            if program != self._binary_name and not (servers and program == MPS_SERVER_BINARY):
                continue
            if (pipe is None and Path(pipe_dir).parent.parent == self._root) or pipe_dir == str(pipe):
                yield pid, Path(pipe_dir)

    # ------------------------------------------------------------ disk state

    def _paths(self, claim_uid: str) -> _Paths:
        if not _CLAIM_UID.match(claim_uid):
            raise MpsError(f"invalid claim uid {claim_uid!r}")
        root = self._root / claim_uid
        return _Paths(root=root, pipe=root / "pipe", log=root / "log", shm=root / "shm")

    def _claim_dirs(self) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self._root) if e.is_dir() and _CLAIM_UID.match(e.name))
        except FileNotFoundError:
            return []

    def _daemon(self, claim_uid: str, paths: _Paths, pid: int | None) -> MpsDaemon:
        return MpsDaemon(
            claim_uid=claim_uid,
            root=paths.root,
            pipe_dir=paths.pipe,
            log_dir=paths.log,
            shm_dir=paths.shm,
            pid=pid,
        )

    def _read_record(self, paths: _Paths) -> dict[str, Any] | None:
        try:
            data = json.loads(paths.record.read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write_record(self, paths: _Paths, record: Mapping[str, Any]) -> None:
        atomic_write(paths.record, json.dumps(record, indent=1, sort_keys=True).encode())

    def _boot_id(self) -> str | None:
        try:
            return self._boot_id_file.read_text().strip()
        except OSError:
            return None

    def _log_tail(self, paths: _Paths, lines: int = 15) -> str:
        parts = []
        for name in ("launcher.log", "control.log"):
            try:
                text = (paths.log / name).read_text(errors="replace").splitlines()
            except OSError:
                continue
            if text:
                parts.append(f"\n--- {name} (last {min(lines, len(text))} lines) ---\n" + "\n".join(text[-lines:]))
        return "".join(parts) if parts else "\n(no MPS log output)"

    # -------------------------------------------------------------- checks

    def _validate(self, spec: MpsSpec, paths: _Paths) -> None:
        claim = spec.claim_uid
        if not spec.device_uuids:
            raise MpsError(f"claim {claim}: an MPS daemon needs at least one device")
        if len(set(spec.device_uuids)) != len(spec.device_uuids):
            raise MpsError(f"claim {claim}: duplicate device uuids {list(spec.device_uuids)}")
        for uuid in spec.device_uuids:
            if not uuid or "," in uuid or any(c.isspace() for c in uuid):
                raise MpsError(f"claim {claim}: invalid device uuid {uuid!r}")
        pct = spec.active_thread_percentage
        if pct is not None and not 1 <= pct <= 100:
            raise MpsError(f"claim {claim}: active thread percentage {pct} is outside 1..100")
        unknown = sorted(set(spec.pinned_memory_limits) - set(spec.device_uuids))
        if unknown:
            raise MpsError(f"claim {claim}: pinned memory limits for devices not in the claim: {unknown}")
        for uuid, limit in spec.pinned_memory_limits.items():
            if limit < MIB:
                raise MpsError(f"claim {claim}: pinned memory limit {limit} bytes for {uuid} is under 1 MiB")
        socket_path = len(os.fsencode(paths.control))
        if socket_path > MAX_SOCKET_PATH:
            raise MpsError(
                f"claim {claim}: control socket path {paths.control} is {socket_path} bytes, over the "
                f"{MAX_SOCKET_PATH}-byte AF_UNIX limit; use a shorter MPS root dir"
            )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _parse_float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _mem_reply_matches(reply: str, mib: int) -> bool:
    """Real daemons show a limit of at least 1 GiB in whole GiB (1044M reads ``1G``)."""
    m = _MEM_REPLY.match(reply.strip())
    if not m:
        return False
    value, unit = int(m.group(1)), m.group(2)
    return value == mib if unit == "M" else mib >= 1024 and value == mib // 1024


def _one_line(text: str, limit: int = 300) -> str:
    flat = " | ".join(line for line in text.strip().splitlines() if line)
    return flat if len(flat) <= limit else flat[:limit] + "..."
