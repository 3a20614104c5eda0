"""Two plugin instances on one node (a seamless rolling update): own socket names, no interference, stale sweep."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from gpuplane.driver import config
from gpuplane.driver.plugin import kubelet_client, server, socket_names
from tests.pluginkit import (
    DRIVER,
    FakePreparer,
    preparer_fixture,  # noqa: F401  (fixture preparer)
    short_dir_fixture,  # noqa: F401  (fixture short_dir)
)

OLD_UID = "0b6f7c3e-1a2b-4c5d-8e9f-000000000001"
NEW_UID = "0b6f7c3e-1a2b-4c5d-8e9f-000000000002"


def _server(short_dir: Path, preparer: FakePreparer, uid: str) -> server.PluginServer:
    return server.PluginServer(DRIVER, preparer, registry_dir=short_dir / "r", plugin_dir=short_dir / "p", instance=uid)


def test_names_carry_the_instance(short_dir: Path, preparer: FakePreparer) -> None:
    srv = _server(short_dir, preparer, OLD_UID)
    assert srv.registration_socket == short_dir / "r" / f"{DRIVER}-{OLD_UID}-reg.sock"
    assert srv.dra_socket == short_dir / "p" / f"dra-{OLD_UID}.sock"
    assert srv.registration.endpoint == str(srv.dra_socket)
    classic = _server(short_dir, preparer, "")
    assert classic.registration_socket.name == f"{DRIVER}-reg.sock"
    assert classic.dra_socket.name == "dra.sock"


def test_old_and_new_serve_side_by_side(short_dir: Path, preparer: FakePreparer) -> None:
    old = _server(short_dir, preparer, OLD_UID)
    new = _server(short_dir, preparer, NEW_UID)
    with old:
        new.start()
        try:
            # The new instance's start removed nothing of the old one's; kubelet can reach both.
            names = sorted(p.name for p in (short_dir / "r").iterdir())
            assert names == [f"{DRIVER}-{OLD_UID}-reg.sock", f"{DRIVER}-{NEW_UID}-reg.sock"]
            for srv in (old, new):
                info = kubelet_client.get_info(srv.registration_socket, timeout=10)
                assert info.endpoint == str(srv.dra_socket)
                with kubelet_client.KubeletPluginClient(info.endpoint, timeout=10) as client:
                    assert client.check_health() == "SERVING"
            old.stop()
            # The old instance's exit removed only its own sockets: the new one still answers.
            assert sorted(p.name for p in (short_dir / "r").iterdir()) == [f"{DRIVER}-{NEW_UID}-reg.sock"]
            assert sorted(p.name for p in (short_dir / "p").glob("*.sock")) == [f"dra-{NEW_UID}.sock"]
            assert kubelet_client.get_info(new.registration_socket, timeout=10).name == DRIVER
        finally:
            new.stop()


def _dead_socket(path: Path, age_s: float) -> None:
    """A socket file nobody listens on (what a SIGKILLed pod leaves), ``age_s`` old."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    then = time.time() - age_s
    os.utime(path, (then, then), follow_symlinks=False)


def test_start_sweeps_sockets_of_dead_instances_only(short_dir: Path, preparer: FakePreparer) -> None:
    dead_reg = short_dir / "r" / f"{DRIVER}-dead-reg.sock"
    dead_dra = short_dir / "p" / "dra-dead.sock"
    young = short_dir / "p" / "dra-starting.sock"
    other_driver = short_dir / "r" / "other.example.com-reg.sock"
    for path in (dead_reg, dead_dra, other_driver):
        _dead_socket(path, age_s=60)
    _dead_socket(young, age_s=0)
    live = _server(short_dir, preparer, OLD_UID)
    with live:
        new = _server(short_dir, preparer, NEW_UID)
        with new:
            assert not dead_reg.exists() and not dead_dra.exists()
            assert young.exists(), "a socket younger than the settle time may be between bind and listen"
            assert other_driver.exists(), "another driver's socket is never ours to remove"
            assert live.registration_socket.is_socket() and live.dra_socket.is_socket()
            assert kubelet_client.get_info(live.registration_socket, timeout=10).name == DRIVER


def test_is_listening(short_dir: Path) -> None:
    path = short_dir / "s.sock"
    assert not socket_names.is_listening(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    try:
        assert socket_names.is_listening(path)
    finally:
        listener.close()
    assert not socket_names.is_listening(path)  # the file stays, nobody listens: ECONNREFUSED


@pytest.mark.parametrize("bad", ["../x", "a/b", "-lead", "x" * 64, "uid with space", "ü"])
def test_hostile_instance_names_are_refused(bad: str, short_dir: Path, preparer: FakePreparer) -> None:
    with pytest.raises(ValueError, match="cannot name a socket"):
        _server(short_dir, preparer, bad)


def test_config_takes_the_pod_uid_and_resolves_symlinks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "short" / "k"
    (real / "plugins_registry").mkdir(parents=True)
    (tmp_path / "by-name").mkdir()
    (tmp_path / "by-name" / "node-a").symlink_to(real)
    monkeypatch.setenv("POD_UID", NEW_UID)
    cfg = config.parse_args(
        [
            "--node-name=node-a",
            "--backend=sim",
            "--sim-profile=hgx-h100",
            f"--registry-dir={tmp_path / 'by-name' / 'node-a' / 'plugins_registry'}",
            f"--plugin-dir={tmp_path / 'by-name' / 'node-a' / 'plugins' / 'gpu.gpuplane.dev'}",
        ]
    )
    assert cfg.plugin_instance == NEW_UID
    assert cfg.registry_dir == real.resolve() / "plugins_registry"
    assert cfg.plugin_dir == real.resolve() / "plugins" / "gpu.gpuplane.dev"
    monkeypatch.setenv("POD_UID", "../../etc")
    with pytest.raises(SystemExit):
        config.parse_args(["--node-name=n", "--backend=sim", "--sim-profile=hgx-h100"])


def test_production_paths_with_a_pod_uid_fit_af_unix(preparer: FakePreparer) -> None:
    srv = server.PluginServer(DRIVER, preparer, instance=NEW_UID)  # /var/lib/kubelet/... defaults
    assert srv.registration_socket == Path(f"/var/lib/kubelet/plugins_registry/{DRIVER}-{NEW_UID}-reg.sock")
    assert srv.dra_socket == Path(f"/var/lib/kubelet/plugins/{DRIVER}/dra-{NEW_UID}.sock")
