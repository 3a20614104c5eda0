"""PluginServer health (gRPC health, the kubelet health stream), shutdown and sockets, over real unix sockets."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from gpuplane.driver._proto.grpc.health.v1 import health_pb2
from gpuplane.driver.observe import health_board, health_view
from gpuplane.driver.plugin import kubelet_client, server, wire
from tests.pluginkit import (
    DRIVER,
    V1,
    FakePreparer,
    board_fixture,  # noqa: F401  (fixture board)
    connect,
    plugin_fixture,  # noqa: F401  (fixture plugin)
    preparer_fixture,  # noqa: F401  (fixture preparer)
    short_dir_fixture,  # noqa: F401  (fixture short_dir)
    timings_fixture,  # noqa: F401  (fixture timings)
)

# --- health ----------------------------------------------------------------------------------------


def test_grpc_health_serving(plugin: server.PluginServer) -> None:
    with kubelet_client.KubeletPluginClient(str(plugin.dra_socket), timeout=10) as client:
        assert client.check_health() == "SERVING"
        assert client.check_health("k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin") == "SERVING"
        with pytest.raises(grpc.RpcError) as err:
            client.check_health("no.such.Service")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_stream_delivers_updates(plugin: server.PluginServer, board: health_board.HealthBoard) -> None:
    with connect(plugin, V1) as client:
        stream = client.watch_health(timeout=20)
        first = next(stream)
        assert first == [health_view.DeviceHealthView("node-a", "gpu-0", True, "ok", last_updated=100, timeout_s=30)]
        board.update([health_view.DeviceHealthView("node-a", "gpu-1", False, "XID 79", last_updated=101)])
        second = next(stream)
        assert [(d.device_name, d.healthy, d.message) for d in second] == [
            ("gpu-0", True, "ok"),
            ("gpu-1", False, "XID 79"),
        ]
        board.update([health_view.DeviceHealthView("node-a", "gpu-1", None, "lost", last_updated=102)])
        assert next(stream)[1].healthy is None
        stream.close()


def test_health_stream_resends_unchanged_health_before_kubelet_stops_trusting_it(
    short_dir: Path, preparer: FakePreparer, board: health_board.HealthBoard
) -> None:
    srv = server.PluginServer(
        DRIVER,
        preparer,
        registry_dir=short_dir / "r",
        plugin_dir=short_dir / "p",
        health_source=board,
        stream_poll_interval=0.05,
        stream_refresh_interval=0.3,
    )
    srv.start()
    try:
        with kubelet_client.KubeletPluginClient(str(srv.dra_socket), timeout=10) as client:
            stream = client.watch_health(timeout=20)
            first = next(stream)
            started = time.monotonic()
            again = next(stream)  # nothing changed: the refresh
            waited = time.monotonic() - started
            stream.close()
        assert again == first
        assert 0.2 <= waited < 2.0, waited
    finally:
        srv.stop(grace=1)


def test_stop_ends_streams_and_removes_sockets(
    short_dir: Path, preparer: FakePreparer, board: health_board.HealthBoard
) -> None:
    srv = server.PluginServer(
        DRIVER,
        preparer,
        registry_dir=short_dir / "r",
        plugin_dir=short_dir / "p",
        health_source=board,
        stream_poll_interval=0.05,
    )
    srv.start()
    client = kubelet_client.KubeletPluginClient(str(srv.dra_socket), timeout=10)
    stream = client.watch_health(timeout=20)
    next(stream)
    rest: list[object] = []
    reader = threading.Thread(target=lambda: rest.extend(stream), daemon=True)
    reader.start()

    started = time.monotonic()
    srv.stop(grace=5)
    assert time.monotonic() - started < 4, "an open health stream held up stop()"
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert not srv.registration_socket.exists()
    assert not srv.dra_socket.exists()
    assert list((short_dir / "r").iterdir()) == []
    srv.stop()  # idempotent
    client.close()


def test_stale_socket_files_are_replaced(short_dir: Path, preparer: FakePreparer) -> None:
    (short_dir / "r").mkdir()
    (short_dir / "p").mkdir()
    (short_dir / "r" / f"{DRIVER}-reg.sock").write_text("stale")
    (short_dir / "p" / "dra.sock").write_text("stale")
    srv = server.PluginServer(DRIVER, preparer, registry_dir=short_dir / "r", plugin_dir=short_dir / "p")
    with srv:
        assert srv.registration_socket.is_socket()
        assert kubelet_client.get_info(srv.registration_socket, timeout=10).name == DRIVER


def test_socket_path_too_long(preparer: FakePreparer) -> None:
    with pytest.raises(ValueError, match="longer than"):
        server.PluginServer(DRIVER, preparer, registry_dir="/tmp/" + "x" * 120, plugin_dir="/tmp/p")


def test_default_dirs(preparer: FakePreparer) -> None:
    srv = server.PluginServer(DRIVER, preparer)
    assert srv.registration_socket == Path(f"/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock")
    assert srv.dra_socket == Path(f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock")
    assert srv.registration.endpoint == str(srv.dra_socket)


def test_grpc_health_watch_sees_shutdown(plugin: server.PluginServer) -> None:
    with grpc.insecure_channel(f"unix:{plugin.dra_socket}") as channel:
        stub = wire.grpc_health_stub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=20)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        listed = stub.List(health_pb2.HealthListRequest(), timeout=10).statuses
        assert {name: s.status for name, s in listed.items()} == {
            "": health_pb2.HealthCheckResponse.SERVING,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": health_pb2.HealthCheckResponse.SERVING,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin": health_pb2.HealthCheckResponse.SERVING,
            "v1alpha1.DRAResourceHealth": health_pb2.HealthCheckResponse.SERVING,
        }
        plugin.grpc_health.shutdown()
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
