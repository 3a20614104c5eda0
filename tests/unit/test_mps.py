"""Per-claim MPS control daemons, run against the stand-in ``nvidia-cuda-mps-control``.

The stand-in (tests/fakes) speaks the real binary's protocol (``-d``, client
mode on stdin, ``quit``) and records what each daemon was told in
``<log dir>/standin-record.json``; gpuplane.driver.sharing.mps runs its production code path
against it. Every test checks, through the ``root`` fixture, that no daemon
outlives it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.driver.sharing import mps, mps_client, mps_spec
from tests.driverkit import mps_processes_under

STANDIN = Path(__file__).resolve().parents[1] / "fakes" / "nvidia-cuda-mps-control"
GPU = "GPU-6f2a1e4c-3b7d-4e8a-9c1f-2d5b8a7e6c01"
MIG_A = "MIG-1a2b3c4d-0000-5e6f-8a9b-0c1d2e3f4a5b"
MIG_B = "MIG-9f8e7d6c-1111-5b4a-8c3d-2e1f0a9b8c7d"
GIB = 1024**3
CLAIM_A = "0b9c3f52-6a1e-4c7d-9e8f-1a2b3c4d5e6f"
CLAIM_B = "7e6d5c4b-3a29-4817-a6b5-c4d3e2f1a0b9"


@pytest.fixture
def root() -> Iterator[Path]:
    """A short temp dir (the control socket path must fit AF_UNIX); fails the test on leaked daemons."""
    path = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    try:
        yield path
        leaked = mps_processes_under(path)
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
        assert not leaked, f"MPS daemons leaked: {leaked}"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _control(root: Path, binary: Path = STANDIN, **kwargs: Any) -> mps.MpsControl:
    kwargs.setdefault("start_timeout_s", 5.0)
    kwargs.setdefault("command_timeout_s", 5.0)
    return mps.MpsControl(root / "mps", str(binary), **kwargs)


def _wrapper(root: Path, name: str, body: str) -> Path:
    """A control binary that sets test-only knobs, then runs the stand-in (same file name as the real one)."""
    path = root / name / "nvidia-cuda-mps-control"
    path.parent.mkdir()
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _spec(claim: str, pct: int | None, limits: dict[str, int], devices: tuple[str, ...] = (GPU,)) -> mps_spec.MpsSpec:
    return mps_spec.MpsSpec(claim, devices, pct, limits)


def _record(daemon: mps_spec.MpsDaemon) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((daemon.log_dir / "standin-record.json").read_text())
    return data


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_two_claims_on_one_gpu_each_get_their_own_daemon_and_limits(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver's own environment must not reach the daemons.
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-driver-own")
    control = _control(root)
    gold = control.start(_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    bronze = control.start(_spec(CLAIM_B, 20, {GPU: 2 * GIB}))

    assert gold.pipe_dir != bronze.pipe_dir
    assert gold.pipe_dir == root / "mps" / CLAIM_A / "pipe"
    for daemon in (gold, bronze):
        assert daemon.pid is not None and _running(daemon.pid)
        assert (daemon.pipe_dir / "nvidia-cuda-mps-control.pid").read_text().strip() == str(daemon.pid)
        assert oct(daemon.pipe_dir.stat().st_mode & 0o777) == oct(0o700)
        assert oct(daemon.log_dir.stat().st_mode & 0o777) == oct(0o700)
        assert daemon.shm_dir.is_dir()
        assert control.alive(daemon.claim_uid)

    for daemon, pct, mib in ((gold, 60, 6144), (bronze, 20, 2048)):
        rec = _record(daemon)
        assert rec["pid"] == daemon.pid
        assert rec["env"] == {
            "CUDA_VISIBLE_DEVICES": GPU,
            "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir),
        }
        # Not from the driver: LC_CTYPE (python3's PEP 538 locale coercion) and what a shell-script
        # ``python3`` launcher such as a pyenv shim exports before it execs the interpreter.
        launcher = {k for k in rec["env_keys"] if k.startswith(("PYENV_", "_PYENV_")) or k in ("PWD", "SHLVL", "_")}
        assert set(rec["env_keys"]) - {"LC_CTYPE"} - launcher == {
            "PATH",
            "CUDA_VISIBLE_DEVICES",
            "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_LOG_DIRECTORY",
        }
        assert rec["defaults"] == {
            "active_thread_percentage": float(pct),
            "device_pinned_mem_limit_mib": {"0": mib},
        }
        told = [c["command"] for c in rec["commands"]]
        assert f"set_default_active_thread_percentage {pct}" in told
        assert f"set_default_device_pinned_mem_limit 0 {mib}M" in told
        assert all(c["ok"] for c in rec["commands"])
        assert f"Cmd:set_default_active_thread_percentage {pct}" in (daemon.log_dir / "control.log").read_text()

    listed = {d.claim_uid: d for d in control.list_daemons()}
    assert listed == {CLAIM_A: gold, CLAIM_B: bronze}

    assert gold.container_env() == {"CUDA_MPS_PIPE_DIRECTORY": mps_spec.CONTAINER_PIPE_DIR}
    assert gold.container_mounts() == [
        mps_spec.Mount(gold.pipe_dir, "/run/gpuplane/mps/pipe", ("rw", "nosuid", "nodev", "bind")),
        mps_spec.Mount(gold.shm_dir, "/dev/shm", ("rw", "nosuid", "nodev", "bind")),
    ]

    gold_pid, bronze_pid = gold.pid, bronze.pid
    assert gold_pid is not None and bronze_pid is not None
    control.stop(CLAIM_A)
    assert not gold.root.exists()
    assert not _running(gold_pid)
    assert not control.alive(CLAIM_A)
    assert _running(bronze_pid)  # the other claim's daemon is untouched
    control.stop(CLAIM_B)
    assert not bronze.root.exists() and not _running(bronze_pid)
    assert control.list_daemons() == []


def test_mig_devices_use_ordinals_in_visible_device_order(root: Path) -> None:
    control = _control(root)
    spec = mps_spec.MpsSpec(CLAIM_A, (MIG_A, MIG_B), None, {MIG_B: 1044 * 1024 * 1024}, owner_uid=os.getuid())
    daemon = control.start(spec)
    rec = _record(daemon)
    assert rec["env"]["CUDA_VISIBLE_DEVICES"] == f"{MIG_A},{MIG_B}"
    told = [c["command"] for c in rec["commands"]]
    # No percentage asked for: none set. The 1044M limit reads back as "1G" (whole GiB), and is accepted.
    assert not any(c.startswith("set_default_active_thread_percentage") for c in told)
    assert "set_default_device_pinned_mem_limit 1 1044M" in told
    assert rec["defaults"]["device_pinned_mem_limit_mib"] == {"1": 1044}
    assert daemon.pipe_dir.stat().st_uid == os.getuid()
    assert oct(daemon.shm_dir.stat().st_mode & 0o7777) == oct(0o1777)
    control.stop(CLAIM_A)


def test_start_is_idempotent_and_refuses_a_different_spec(root: Path) -> None:
    control = _control(root)
    spec = _spec(CLAIM_A, 60, {GPU: 6 * GIB})
    first = control.start(spec)
    commands = len(_record(first)["commands"])
    again = control.start(_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    assert again == first
    assert len(_record(first)["commands"]) == commands  # nothing re-sent

    with pytest.raises(mps_spec.MpsError, match="different spec"):
        control.start(_spec(CLAIM_A, 20, {GPU: 6 * GIB}))
    assert control.alive(CLAIM_A)  # the running daemon is left alone

    control.stop(CLAIM_A)
    control.stop(CLAIM_A)  # idempotent
    control.stop(CLAIM_B)  # never started: no-op
    assert not (root / "mps" / CLAIM_A).exists()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('GPUPLANE_STANDIN_EXIT=1 exec {standin} "$@"', r"-d exited with status 1(.|\n)*told to fail"),
        ("exit 0", "exited right after starting"),
        (
            'GPUPLANE_STANDIN_FAIL=set_default_active_thread_percentage exec {standin} "$@"',
            r"set_default_active_thread_percentage 60 was refused(.|\n)*control.log(.|\n)*"
            r"Cmd:set_default_active_thread_percentage 60",
        ),
        (
            'GPUPLANE_STANDIN_FAIL=set_default_device_pinned_mem_limit exec {standin} "$@"',
            r"set_default_device_pinned_mem_limit 0 6144M \(GPU-.*\) did not take(.|\n)*injected",
        ),
    ],
    ids=["binary-exits-1", "daemon-vanishes", "percentage-refused", "memory-limit-refused"],
)
def test_failed_start_leaves_nothing_behind(root: Path, body: str, message: str) -> None:
    binary = _wrapper(root, "bin", body.format(standin=STANDIN))
    control = _control(root, binary)
    with pytest.raises(mps_spec.MpsError, match=message):
        control.start(_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    assert not (root / "mps" / CLAIM_A).exists()
    assert not control.alive(CLAIM_A)


def test_missing_binary_is_a_clear_error(root: Path) -> None:
    control = _control(root, root / "nowhere" / "nvidia-cuda-mps-control")
    with pytest.raises(mps_spec.MpsError, match="cannot run"):
        control.start(_spec(CLAIM_A, 60, {}))
    assert not (root / "mps" / CLAIM_A).exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_spec(CLAIM_A, 0, {}), "outside 1..100"),
        (_spec(CLAIM_A, 101, {}), "outside 1..100"),
        (_spec(CLAIM_A, 50, {MIG_A: GIB}), "not in the claim"),
        (_spec(CLAIM_A, 50, {GPU: 1000}), "under 1 MiB"),
        (_spec(CLAIM_A, 50, {}, devices=()), "at least one device"),
        (_spec(CLAIM_A, 50, {}, devices=(GPU, GPU)), "duplicate"),
        (_spec("../escape", 50, {}), "invalid claim uid"),
    ],
)
def test_invalid_spec_is_refused_before_anything_is_made(root: Path, spec: mps_spec.MpsSpec, message: str) -> None:
    control = _control(root)
    with pytest.raises(mps_spec.MpsError, match=message):
        control.start(spec)
    assert not (root / "mps").exists() or not any((root / "mps").iterdir())


def test_control_socket_path_over_the_af_unix_limit_is_refused(root: Path) -> None:
    deep = root / ("d" * 80)
    control = mps.MpsControl(deep, str(STANDIN))
    with pytest.raises(mps_spec.MpsError, match="AF_UNIX"):
        control.start(_spec(CLAIM_A, 50, {}))
    assert not deep.exists()


def test_a_restarted_driver_finds_and_stops_daemons_of_its_previous_life(root: Path) -> None:
    before = _control(root)
    a = before.start(_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    b = before.start(_spec(CLAIM_B, 20, {GPU: 2 * GIB}))
    del before  # the driver "crashes": only the disk and the processes remain

    after = _control(root)
    assert {d.claim_uid: d.pid for d in after.list_daemons()} == {CLAIM_A: a.pid, CLAIM_B: b.pid}
    assert after.cleanup_orphans(keep={CLAIM_B}) == [CLAIM_A]
    assert a.pid is not None and not _running(a.pid)
    assert not a.root.exists()
    assert after.alive(CLAIM_B)
    # A kept claim's daemon is returned as is by a repeated prepare.
    assert after.start(_spec(CLAIM_B, 20, {GPU: 2 * GIB})) == b
    assert after.cleanup_orphans(keep=set()) == [CLAIM_B]
    assert after.list_daemons() == []


def test_crash_between_launch_and_record_is_recovered(root: Path) -> None:
    control = _control(root)
    first = control.start(_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    assert first.pid is not None
    # As if SIGKILLed right after `-d` returned: the record still says "starting", no pid.
    record_path = first.root / "daemon.json"
    record = json.loads(record_path.read_text())
    record.update(phase="starting", pid=None)
    record_path.write_text(json.dumps(record))

    restarted = _control(root)
    assert restarted.alive(CLAIM_A)  # found through the daemon's pid file
    # A repeated prepare does not trust a half-configured daemon: it starts over.
    second = restarted.start(_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    assert second.pid != first.pid
    assert not _running(first.pid)
    assert _record(second)["defaults"]["active_thread_percentage"] == 60.0
    restarted.stop(CLAIM_A)


def test_daemon_found_from_its_environment_when_pid_file_and_record_are_gone(root: Path) -> None:
    control = _control(root)
    daemon = control.start(_spec(CLAIM_A, 60, {}))
    assert daemon.pid is not None
    (daemon.root / "daemon.json").unlink()
    (daemon.pipe_dir / "nvidia-cuda-mps-control.pid").unlink()
    restarted = _control(root)
    assert restarted.alive(CLAIM_A)
    assert restarted.list_daemons() == []  # no record: not listed, but still cleaned up
    assert restarted.cleanup_orphans(keep=set()) == [CLAIM_A]
    assert not _running(daemon.pid)


def test_daemon_whose_claim_dir_vanished_is_killed(root: Path) -> None:
    control = _control(root)
    daemon = control.start(_spec(CLAIM_A, 60, {}))
    assert daemon.pid is not None
    shutil.rmtree(daemon.root)
    assert _control(root).cleanup_orphans(keep=set()) == [CLAIM_A]
    assert not _running(daemon.pid)


def test_half_made_and_corrupt_dirs_are_removed(root: Path) -> None:
    half = root / "mps" / CLAIM_A
    (half / "pipe").mkdir(parents=True)
    corrupt = root / "mps" / CLAIM_B
    corrupt.mkdir()
    (corrupt / "daemon.json").write_text("{not json")
    kept = root / "mps" / "kept-claim"
    (kept / "log").mkdir(parents=True)
    control = _control(root)
    assert control.list_daemons() == []
    assert control.cleanup_orphans(keep={"kept-claim"}) == [CLAIM_A, CLAIM_B]
    assert not half.exists() and not corrupt.exists() and kept.exists()


def test_a_half_made_dir_does_not_block_a_new_start(root: Path) -> None:
    (root / "mps" / CLAIM_A / "pipe").mkdir(parents=True)
    control = _control(root)
    daemon = control.start(_spec(CLAIM_A, 30, {}))
    assert control.alive(CLAIM_A) and _record(daemon)["defaults"]["active_thread_percentage"] == 30.0
    control.stop(CLAIM_A)


def test_stop_escalates_to_signals_when_quit_gets_no_answer(root: Path) -> None:
    control = _control(root, command_timeout_s=0.5)
    daemon = control.start(_spec(CLAIM_A, 60, {}))
    assert daemon.pid is not None
    os.kill(daemon.pid, signal.SIGSTOP)  # a hung daemon: `quit` gets no answer
    started = time.monotonic()
    control.stop(CLAIM_A)
    assert not _running(daemon.pid)
    assert not daemon.root.exists()
    assert time.monotonic() - started < 9


_DRIVER = """
import sys
from pathlib import Path
from gpuplane.driver.sharing import mps, mps_spec
control = mps.MpsControl(Path(sys.argv[1]), sys.argv[2], start_timeout_s=5, command_timeout_s=5)
print("go", flush=True)
control.start(mps_spec.MpsSpec(sys.argv[3], (sys.argv[4],), 60, {sys.argv[4]: 6 * 1024**3}))
print("ready", flush=True)
"""


@pytest.mark.parametrize("kill_after_s", [0.0, 0.03, 0.08, 0.15, 0.25, 0.4])
def test_sigkill_of_the_driver_at_any_step_leaks_no_daemon(root: Path, kill_after_s: float) -> None:
    repo = Path(__file__).resolve().parents[2]
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(root / "mps"), str(STANDIN), CLAIM_A, GPU],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == "go"
    time.sleep(kill_after_s)
    driver.kill()
    driver.wait()

    restarted = _control(root)
    assert restarted.cleanup_orphans(keep=set()) in ([], [CLAIM_A])
    assert not (root / "mps" / CLAIM_A).exists()
    deadline = time.monotonic() + 5  # a client the dead driver had in flight may still be exiting
    while mps_processes_under(root):
        assert time.monotonic() < deadline, mps_processes_under(root)
        time.sleep(0.05)


def test_standin_follows_the_client_protocol(root: Path) -> None:
    pipe, logs = root / "pipe", root / "log"
    pipe.mkdir()
    logs.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
        "CUDA_VISIBLE_DEVICES": GPU,
    }

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(STANDIN), *args],
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )

    no_daemon = run(stdin="get_server_list\n")
    assert no_daemon.returncode == 1
    assert "Cannot find MPS control daemon process" in no_daemon.stdout
    assert run("-d").returncode == 0
    deadline = time.monotonic() + 5
    while not (pipe / "control").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert run("-d").returncode == 1  # one daemon per pipe dir
    replies = run(
        stdin="set_default_active_thread_percentage 0\nset_default_active_thread_percentage 101\n"
        "set_default_active_thread_percentage 25\nget_default_active_thread_percentage\n"
        "set_default_device_pinned_mem_limit 1 1G\nset_default_device_pinned_mem_limit 0 10X\n"
        "set_default_device_pinned_mem_limit 0 512M\nget_default_device_pinned_mem_limit 0\nno_such_command\n"
    )
    assert replies.returncode == 0
    lines = replies.stdout.splitlines()
    assert lines[0].startswith("Error") and lines[1].startswith("Error")
    assert lines[2:4] == ["25.0", "25.0"]
    assert lines[4].startswith("Error: invalid device") and lines[5].startswith("Error: invalid memory")
    assert lines[6] == "512M"  # the accepted set printed nothing
    assert lines[7].startswith("Error: unknown")
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    assert run(stdin="quit\n").returncode == 0
    deadline = time.monotonic() + 5
    while _running(pid):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not (pipe / "control").exists() and not (pipe / "nvidia-cuda-mps-control.pid").exists()
    rec = json.loads((logs / "standin-record.json").read_text())
    assert rec["quit_at"] is not None and rec["commands"][-1]["command"] == "quit"


@pytest.mark.parametrize(
    ("reply", "mib", "ok"),
    [
        ("6144M", 6144, True),
        ("6G", 6144, True),
        ("1G", 1044, True),
        ("512M", 512, True),
        ("1G", 512, False),
        ("2G", 1044, False),
        ("6144 MB", 6144, False),
        ("Not set", 10, False),
    ],
)
def test_pinned_limit_readback(reply: str, mib: int, ok: bool) -> None:
    assert mps_client.mem_reply_matches(reply, mib) is ok
