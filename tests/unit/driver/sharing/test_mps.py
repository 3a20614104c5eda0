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
import subprocess
import time
from pathlib import Path

import pytest

from gpuplane.driver.sharing import mps, mps_client, mps_spec
from tests.mpskit import (
    CLAIM_A,
    CLAIM_B,
    GIB,
    GPU,
    MIG_A,
    MIG_B,
    STANDIN,
    is_running,
    make_control,
    make_spec,
    mps_root,  # noqa: F401  (the leak-checking fixture, named root)
    standin_record,
    wrapper_binary,
)


def test_two_claims_on_one_gpu_each_get_their_own_daemon_and_limits(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver's own environment must not reach the daemons.
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-driver-own")
    control = make_control(root)
    gold = control.start(make_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    bronze = control.start(make_spec(CLAIM_B, 20, {GPU: 2 * GIB}))

    assert gold.pipe_dir != bronze.pipe_dir
    assert gold.pipe_dir == root / "mps" / CLAIM_A / "pipe"
    for daemon in (gold, bronze):
        assert daemon.pid is not None and is_running(daemon.pid)
        assert (daemon.pipe_dir / "nvidia-cuda-mps-control.pid").read_text().strip() == str(daemon.pid)
        assert oct(daemon.pipe_dir.stat().st_mode & 0o777) == oct(0o700)
        assert oct(daemon.log_dir.stat().st_mode & 0o777) == oct(0o700)
        assert daemon.shm_dir.is_dir()
        assert control.alive(daemon.claim_uid)

    for daemon, pct, mib in ((gold, 60, 6144), (bronze, 20, 2048)):
        rec = standin_record(daemon)
        assert rec["pid"] == daemon.pid
        assert rec["env"] == {
            "CUDA_VISIBLE_DEVICES": GPU,
            "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir),
            "CUDA_MPS_CLIENT_PRIORITY": None,
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
            "client_priority": 0,
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
    assert not is_running(gold_pid)
    assert not control.alive(CLAIM_A)
    assert is_running(bronze_pid)  # the other claim's daemon is untouched
    control.stop(CLAIM_B)
    assert not bronze.root.exists() and not is_running(bronze_pid)
    assert control.list_daemons() == []


def test_mig_devices_use_ordinals_in_visible_device_order(root: Path) -> None:
    control = make_control(root)
    spec = mps_spec.MpsSpec(CLAIM_A, (MIG_A, MIG_B), None, {MIG_B: 1044 * 1024 * 1024}, owner_uid=os.getuid())
    daemon = control.start(spec)
    rec = standin_record(daemon)
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
    control = make_control(root)
    spec = make_spec(CLAIM_A, 60, {GPU: 6 * GIB})
    first = control.start(spec)
    commands = len(standin_record(first)["commands"])
    again = control.start(make_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    assert again == first
    assert len(standin_record(first)["commands"]) == commands  # nothing re-sent

    with pytest.raises(mps_spec.MpsError, match="different spec"):
        control.start(make_spec(CLAIM_A, 20, {GPU: 6 * GIB}))
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
    binary = wrapper_binary(root, "bin", body.format(standin=STANDIN))
    control = make_control(root, binary)
    with pytest.raises(mps_spec.MpsError, match=message):
        control.start(make_spec(CLAIM_A, 60, {GPU: 6 * GIB}))
    assert not (root / "mps" / CLAIM_A).exists()
    assert not control.alive(CLAIM_A)


def test_missing_binary_is_a_clear_error(root: Path) -> None:
    control = make_control(root, root / "nowhere" / "nvidia-cuda-mps-control")
    with pytest.raises(mps_spec.MpsError, match="cannot run"):
        control.start(make_spec(CLAIM_A, 60, {}))
    assert not (root / "mps" / CLAIM_A).exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (make_spec(CLAIM_A, 0, {}), "outside 1..100"),
        (make_spec(CLAIM_A, 101, {}), "outside 1..100"),
        (make_spec(CLAIM_A, 50, {MIG_A: GIB}), "not in the claim"),
        (make_spec(CLAIM_A, 50, {GPU: 1000}), "under 1 MiB"),
        (make_spec(CLAIM_A, 50, {}, devices=()), "at least one device"),
        (make_spec(CLAIM_A, 50, {}, devices=(GPU, GPU)), "duplicate"),
        (make_spec("../escape", 50, {}), "invalid claim uid"),
    ],
)
def test_invalid_spec_is_refused_before_anything_is_made(root: Path, spec: mps_spec.MpsSpec, message: str) -> None:
    control = make_control(root)
    with pytest.raises(mps_spec.MpsError, match=message):
        control.start(spec)
    assert not (root / "mps").exists() or not any((root / "mps").iterdir())


def test_control_socket_path_over_the_af_unix_limit_is_refused(root: Path) -> None:
    deep = root / ("d" * 80)
    control = mps.MpsControl(deep, str(STANDIN))
    with pytest.raises(mps_spec.MpsError, match="AF_UNIX"):
        control.start(make_spec(CLAIM_A, 50, {}))
    assert not deep.exists()


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
    while is_running(pid):
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
