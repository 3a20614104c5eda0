"""The ``nvidia-imex`` and ``nvidia-imex-ctl`` stand-ins (tests/fakes): a three-node IMEX domain on loopback.

Each simulated node's daemon binds its own loopback address (127.0.0.x) on one shared peer port, as
real daemons share ``SERVER_PORT`` across a domain, and serves its command service on a UNIX socket.
Checked: ready only once every peer of the node file is connected (a daemon not yet started keeps
the others not ready), a lost peer (the ``standin-drop`` control) and a crash make the domain not
ready and are recovered from, ``SIGUSR1`` re-reads the node file, and a misconfigured daemon exits
with a message instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[3] / "fakes"
IMEX, CTL = FAKES / "nvidia-imex", FAKES / "nvidia-imex-ctl"
ADDRESSES = ("127.0.0.41", "127.0.0.42", "127.0.0.43")
SETTLE_S = 30.0  # an upper bound for loopback connections to form; each wait ends as soon as it holds


def free_port() -> int:
    """A port free on every address of the domain."""
    while True:
        with socket.socket() as probe:
            probe.bind((ADDRESSES[0], 0))
            port = int(probe.getsockname()[1])
        try:
            for address in ADDRESSES[1:]:
                with socket.socket() as other:
                    other.bind((address, port))
            return port
        except OSError:
            continue


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not check():
        assert time.monotonic() < deadline, f"not within {SETTLE_S:.0f}s: {what}"
        time.sleep(0.05)


class Node:
    """One simulated node's IMEX daemon: its config dir, command socket and process."""

    def __init__(self, root: Path, address: str, port: int, nodes_file: Path) -> None:
        self.address = address
        self.dir = root / address
        self.dir.mkdir(parents=True)
        self.socket = self.dir / "cmd.sock"
        self.config = self.dir / "config.cfg"
        self.config.write_text(
            "# written the way NVIDIA's DRA driver templates it\n"
            f"SERVER_PORT={port}\nIMEX_NODE_CONFIG_FILE={nodes_file}\nBIND_INTERFACE_IP={address}\n"
            f"IMEX_WAIT_FOR_QUORUM=RECOVERY\nIMEX_CMD_ENABLED=1\nIMEX_CMD_UNIX_DOMAIN_PATH={self.socket}\n"
        )
        self.proc: subprocess.Popen[str] | None = None

    def start(self, **env: str) -> Node:
        self.proc = subprocess.Popen(
            [sys.executable, str(IMEX), "-c", str(self.config)],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return self

    def ctl(self, flag: str) -> str:
        argv = [sys.executable, str(CTL), flag, f"--u={self.socket}"]
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else f"rc {done.returncode}: {done.stderr.strip()}"

    def ready(self) -> bool:
        return self.ctl("-q") == "READY"

    def record(self) -> dict[str, object]:
        """The daemon's record ({} before its first write)."""
        path = self.dir / "standin-record.json"
        data: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
        return data

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def domain(tmp_path: Path) -> Iterator[tuple[list[Node], Path]]:
    nodes_file = tmp_path / "nodes_config.cfg"
    nodes_file.write_text("\n".join(ADDRESSES) + "\n")
    port = free_port()
    nodes = [Node(tmp_path, a, port, nodes_file) for a in ADDRESSES]
    try:
        yield nodes, nodes_file
    finally:
        for node in nodes:
            node.stop()


def test_ready_only_once_every_peer_is_connected(domain: tuple[list[Node], Path]) -> None:
    (a, b, c), _ = domain
    a.start()
    b.start()
    until(lambda: a.record().get("connected") == [b.address], "a connected to b")
    assert a.ctl("-q") == "NOT_READY" and b.ctl("-q") == "NOT_READY"  # c never started: no quorum
    assert a.ctl("-N").splitlines() == [
        f"{a.address} SELF",
        f"{b.address} CONNECTED",
        f"{c.address} DISCONNECTED",
        "DOMAIN NOT_READY",
    ]
    c.start(GPUPLANE_IMEX_SLOW_S="0.5")
    until(lambda: all(n.ready() for n in (a, b, c)), "the whole domain ready")
    assert c.ctl("-N").splitlines()[-1] == "DOMAIN READY"


def test_a_lost_peer_and_a_crash_are_seen_and_recovered(domain: tuple[list[Node], Path]) -> None:
    (a, b, c), nodes_file = domain
    for node in (a, b, c):
        node.start()
    until(lambda: all(n.ready() for n in (a, b, c)), "the whole domain ready")

    (a.dir / "standin-drop").write_text(f"{c.address}\n")  # a loses c (both ways)
    until(lambda: not a.ready() and not c.ready(), "a and c not ready")
    assert b.ready(), "b still reaches both"
    (a.dir / "standin-drop").unlink()
    until(lambda: all(n.ready() for n in (a, b, c)), "ready again once the peer is back")

    c.stop()
    c.start(GPUPLANE_IMEX_CRASH_AFTER_S="0.2")
    assert c.proc is not None and c.proc.wait(timeout=SETTLE_S) == 3
    until(lambda: not a.ready() and not b.ready(), "the crash seen by the peers")

    nodes_file.write_text(f"{a.address}\n{b.address}\n")  # the operator takes c out; SIGUSR1 re-reads
    for node in (a, b):
        assert node.proc is not None
        node.proc.send_signal(signal.SIGUSR1)
    until(lambda: a.ready() and b.ready(), "a two-node domain ready after the reload")
    assert a.record()["reloads"] == 1 and a.record()["nodes"] == [a.address, b.address]


def test_the_control_directory_makes_a_daemon_slow_crash_or_lose_a_peer(
    domain: tuple[list[Node], Path], tmp_path: Path
) -> None:
    """``GPUPLANE_IMEX_STANDIN_CONTROL``: files a test writes before or while a daemon runs (its runner owns the
    config directory and removes it on a stop, so a test cannot leave controls there ahead of a start)."""
    (a, b, c), _ = domain
    controls = {n.address: tmp_path / f"control-{n.address}" for n in (a, b, c)}
    for path in controls.values():
        path.mkdir()
    (controls[c.address] / "slow").write_text("1.5\n")
    started = time.monotonic()
    for node in (a, b, c):
        node.start(GPUPLANE_IMEX_STANDIN_CONTROL=str(controls[node.address]))
    until(lambda: a.ctl("-q") == "NOT_READY", "a answers, waiting for its peers")
    assert not c.ready(), "c is still in its slow start"
    until(lambda: all(n.ready() for n in (a, b, c)), "the domain ready once c is up")
    assert time.monotonic() - started >= 1.5

    (controls[a.address] / "drop").write_text(f"{b.address}\n")  # a loses b
    until(lambda: not a.ready() and not b.ready(), "a and b not ready")
    (controls[a.address] / "drop").unlink()
    until(lambda: all(n.ready() for n in (a, b, c)), "ready again once the peer is back")

    (controls[b.address] / "crash").write_text("")
    assert b.proc is not None and b.proc.wait(timeout=SETTLE_S) == 3
    assert not (controls[b.address] / "crash").exists(), "one crash per file: the daemon took it"
    until(lambda: not a.ready() and not c.ready(), "the crash seen by the peers")
    b.start(GPUPLANE_IMEX_STANDIN_CONTROL=str(controls[b.address]))
    until(lambda: all(n.ready() for n in (a, b, c)), "ready again once b is restarted")


def test_misconfiguration_fails_loudly(tmp_path: Path) -> None:
    other = tmp_path / "nodes.cfg"
    other.write_text("127.0.0.99\n")
    node = Node(tmp_path, ADDRESSES[0], free_port(), other).start()
    assert node.proc is not None
    _, err = node.proc.communicate(timeout=SETTLE_S)
    assert node.proc.returncode == 1
    assert f"this node's address {ADDRESSES[0]} is not in the node file" in err
    argv = [sys.executable, str(CTL), "-q", f"--u={tmp_path / 'none.sock'}"]
    missing = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=10)
    assert missing.returncode == 1 and "cannot reach the IMEX command service" in missing.stderr
