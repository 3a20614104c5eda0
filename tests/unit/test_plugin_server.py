"""PluginServer over real unix sockets, driven by the kubelet-side client and raw stubs."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import grpc
import pytest

from gpuplane.driver._proto.dra.v1 import api_pb2 as v1_pb2
from gpuplane.driver._proto.grpc.health.v1 import health_pb2
from gpuplane.driver._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from gpuplane.driver.observe import health_board, health_view
from gpuplane.driver.plugin import dra_servicer, kubelet_client, server, wire
from gpuplane.driver.prepare import contract

DRIVER = "gpu.gpuplane.dev"
V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"


def _claim(i: int) -> contract.ClaimRef:
    return contract.ClaimRef(namespace="ns", uid=f"uid-{i}", name=f"claim-{i}")


def _devices(n: int, share: bool) -> tuple[contract.PreparedDevice, ...]:
    return tuple(
        contract.PreparedDevice(
            request_names=("gpu",) if i % 2 else ("gpu", "extra"),
            pool_name="node-a",
            device_name=f"gpu-{i}",
            cdi_device_ids=(f"gpuplane.dev/gpu=gpu-{i}", f"gpuplane.dev/gpu=common-{i}"),
            share_id=f"share-{i}" if share else None,
        )
        for i in range(n)
    )


class FakePreparer:
    """Answers from a table; can fail claims, omit them, or raise for a whole batch."""

    def __init__(self) -> None:
        self.prepared: dict[str, contract.PrepareResult] = {}
        self.unprepare_errors: dict[str, str] = {}
        self.omit: set[str] = set()
        self.raise_on_call = False
        self.delay_s = 0.0  # how long each call takes
        self.calls: list[tuple[str, list[contract.ClaimRef]]] = []

    def prepare(self, claims: Sequence[contract.ClaimRef]) -> Mapping[str, contract.PrepareResult]:
        self.calls.append(("prepare", list(claims)))
        time.sleep(self.delay_s)
        if self.raise_on_call:
            raise RuntimeError("apiserver unreachable")
        return {
            c.uid: self.prepared.get(c.uid, contract.PrepareResult(error=f"unknown claim {c.uid}"))
            for c in claims
            if c.uid not in self.omit
        }

    def unprepare(self, claims: Sequence[contract.ClaimRef]) -> Mapping[str, contract.UnprepareResult]:
        self.calls.append(("unprepare", list(claims)))
        if self.raise_on_call:
            raise RuntimeError("apiserver unreachable")
        return {
            c.uid: contract.UnprepareResult(error=self.unprepare_errors.get(c.uid, ""))
            for c in claims
            if c.uid not in self.omit
        }


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def preparer() -> FakePreparer:
    return FakePreparer()


@pytest.fixture
def board() -> health_board.HealthBoard:
    return health_board.HealthBoard(
        [health_view.DeviceHealthView("node-a", "gpu-0", True, "ok", last_updated=100, timeout_s=30)]
    )


@pytest.fixture
def timings() -> list[tuple[str, float, int]]:
    return []


@pytest.fixture
def plugin(
    short_dir: Path,
    preparer: FakePreparer,
    board: health_board.HealthBoard,
    timings: list[tuple[str, float, int]],
) -> Iterator[server.PluginServer]:
    srv = server.PluginServer(
        DRIVER,
        preparer,
        registry_dir=short_dir / "reg",
        plugin_dir=short_dir / "plugins" / DRIVER,
        health_source=board,
        timing=lambda op, seconds, errors: timings.append((op, seconds, errors)),
        stream_poll_interval=0.05,
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop(grace=1)


def _connect(plugin: server.PluginServer, version: str) -> kubelet_client.KubeletPluginClient:
    return kubelet_client.KubeletPluginClient.discover(plugin.registration_socket, timeout=10, force_version=version)


# --- registration ---------------------------------------------------------------------------------


def test_sockets_at_kubelet_paths(plugin: server.PluginServer, short_dir: Path) -> None:
    assert plugin.registration_socket == short_dir / "reg" / f"{DRIVER}-reg.sock"
    assert plugin.dra_socket == short_dir / "plugins" / DRIVER / "dra.sock"
    for path in (plugin.registration_socket, plugin.dra_socket):
        assert path.is_socket()
        assert path.stat().st_mode & 0o777 == 0o600
    # No hidden bind-time name left behind for kubelet's watcher to trip on.
    assert sorted(p.name for p in (short_dir / "reg").iterdir()) == [f"{DRIVER}-reg.sock"]


def test_get_info(plugin: server.PluginServer) -> None:
    info = kubelet_client.get_info(plugin.registration_socket, timeout=10)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugin.dra_socket)
    assert info.supported_versions == (V1, V1BETA1, "v1alpha1.DRAResourceHealth")


def test_get_info_without_health_source(short_dir: Path, preparer: FakePreparer) -> None:
    srv = server.PluginServer(DRIVER, preparer, registry_dir=short_dir / "r", plugin_dir=short_dir / "p")
    with srv:
        info = kubelet_client.get_info(srv.registration_socket, timeout=10)
        assert info.supported_versions == (V1, V1BETA1)
        with kubelet_client.KubeletPluginClient(info.endpoint, timeout=10) as client:
            with pytest.raises(grpc.RpcError) as err:
                next(client.watch_health(timeout=5))
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_notify_registration_status_recorded(plugin: server.PluginServer) -> None:
    assert not plugin.registered.is_set()
    assert plugin.registration.status is None
    client = _connect(plugin, V1)
    client.close()
    assert plugin.registered.is_set()
    assert plugin.registration.status is not None
    assert plugin.registration.status.plugin_registered

    kubelet_client.notify_registration_status(plugin.registration_socket, False, "version mismatch", 10)
    assert not plugin.registered.is_set()
    assert plugin.registration.status.error == "version mismatch"


def test_raw_registration_method_paths(plugin: server.PluginServer) -> None:
    with grpc.insecure_channel(f"unix:{plugin.registration_socket}") as channel:
        get_info = channel.unary_unary(
            "/pluginregistration.Registration/GetInfo",
            request_serializer=reg_pb2.InfoRequest.SerializeToString,
            response_deserializer=reg_pb2.PluginInfo.FromString,
        )
        assert get_info(reg_pb2.InfoRequest(), timeout=10).type == "DRAPlugin"


def test_discover_picks_v1_first(plugin: server.PluginServer) -> None:
    with kubelet_client.KubeletPluginClient.discover(plugin.registration_socket, timeout=10) as client:
        assert client.version == V1
    assert kubelet_client.choose_version([V1BETA1, V1]) == V1BETA1  # the plugin's order decides
    with pytest.raises(kubelet_client.RegistrationError):
        kubelet_client.choose_version(["v1alpha4.Node"])


# --- prepare / unprepare --------------------------------------------------------------------------


@pytest.mark.parametrize("version", [V1, V1BETA1])
@pytest.mark.parametrize("n_devices", [1, 2, 8])
def test_prepare_unprepare_round_trip(
    plugin: server.PluginServer,
    preparer: FakePreparer,
    timings: list[tuple[str, float, int]],
    version: str,
    n_devices: int,
) -> None:
    claim = _claim(1)
    preparer.prepared[claim.uid] = contract.PrepareResult(devices=_devices(n_devices, share=True))
    with _connect(plugin, version) as client:
        assert client.version == version
        got = client.prepare([claim])
        expected = _devices(n_devices, share=version == V1)  # v1beta1 has no share_id
        assert got == {claim.uid: contract.PrepareResult(devices=expected)}
        assert client.unprepare([claim]) == {claim.uid: contract.UnprepareResult()}
    assert preparer.calls == [("prepare", [claim]), ("unprepare", [claim])]
    assert [(op, errors) for op, _, errors in timings] == [("prepare", 0), ("unprepare", 0)]


def test_rpc_timing_covers_the_preparer_call(
    plugin: server.PluginServer, preparer: FakePreparer, timings: list[tuple[str, float, int]]
) -> None:
    """The seconds reported for a call include the preparer's work and no more than the client waited."""
    claim = _claim(1)
    preparer.prepared[claim.uid] = contract.PrepareResult(devices=_devices(1, share=True))
    preparer.delay_s = 0.05
    with _connect(plugin, V1) as client:
        started = time.perf_counter()
        client.prepare([claim])
        waited = time.perf_counter() - started
    ((op, seconds, errors),) = timings
    assert (op, errors) == ("prepare", 0)
    assert preparer.delay_s <= seconds <= waited, (seconds, waited)


def test_share_id_absent_stays_absent(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    claim = _claim(1)
    preparer.prepared[claim.uid] = contract.PrepareResult(devices=_devices(2, share=False))
    with _connect(plugin, V1) as client:
        assert client.prepare([claim])[claim.uid].devices == _devices(2, share=False)


def test_raw_v1_method_path_and_share_id_on_wire(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    preparer.prepared["u"] = contract.PrepareResult(devices=_devices(1, share=True))
    with grpc.insecure_channel(f"unix:{plugin.dra_socket}") as channel:
        call = channel.unary_unary(
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            request_serializer=v1_pb2.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=v1_pb2.NodePrepareResourcesResponse.FromString,
        )
        request = v1_pb2.NodePrepareResourcesRequest(claims=[v1_pb2.Claim(namespace="ns", uid="u", name="c")])
        response = call(request, timeout=10)
    device = response.claims["u"].devices[0]
    assert device.HasField("share_id")
    assert device.share_id == "share-0"


@pytest.mark.parametrize("version", [V1, V1BETA1])
def test_one_failing_claim_does_not_fail_the_batch(
    plugin: server.PluginServer,
    preparer: FakePreparer,
    timings: list[tuple[str, float, int]],
    version: str,
) -> None:
    claims = [_claim(i) for i in range(4)]
    for c in claims:
        preparer.prepared[c.uid] = contract.PrepareResult(devices=_devices(1, share=False))
    preparer.prepared["uid-2"] = contract.PrepareResult(error="MIG instance creation failed")
    preparer.unprepare_errors["uid-3"] = "device busy"
    with _connect(plugin, version) as client:
        prepared = client.prepare(claims)
        unprepared = client.unprepare(claims)
    assert set(prepared) == {c.uid for c in claims}
    assert prepared["uid-2"] == contract.PrepareResult(error="MIG instance creation failed")
    assert all(prepared[u].devices and not prepared[u].error for u in ("uid-0", "uid-1", "uid-3"))
    assert unprepared == {
        "uid-0": contract.UnprepareResult(),
        "uid-1": contract.UnprepareResult(),
        "uid-2": contract.UnprepareResult(),
        "uid-3": contract.UnprepareResult(error="device busy"),
    }
    assert [(op, errors) for op, _, errors in timings] == [("prepare", 1), ("unprepare", 1)]


def test_omitted_claim_gets_an_error(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    claims = [_claim(i) for i in range(3)]
    for c in claims:
        preparer.prepared[c.uid] = contract.PrepareResult(devices=_devices(1, share=False))
    preparer.omit = {"uid-1"}
    with _connect(plugin, V1) as client:
        prepared = client.prepare(claims)
        unprepared = client.unprepare(claims)
    assert prepared["uid-1"].error == dra_servicer.OMITTED_ERROR
    assert prepared["uid-0"].devices and prepared["uid-2"].devices
    assert unprepared["uid-1"].error == dra_servicer.OMITTED_ERROR
    assert unprepared["uid-0"] == unprepared["uid-2"] == contract.UnprepareResult()


def test_raising_preparer_errors_every_claim_not_the_call(
    plugin: server.PluginServer, preparer: FakePreparer, timings: list[tuple[str, float, int]]
) -> None:
    preparer.raise_on_call = True
    claims = [_claim(i) for i in range(2)]
    with _connect(plugin, V1BETA1) as client:
        prepared = client.prepare(claims)
        unprepared = client.unprepare(claims)
    assert set(prepared) == set(unprepared) == {"uid-0", "uid-1"}
    assert all("RuntimeError: apiserver unreachable" in r.error for r in prepared.values())
    assert all("apiserver unreachable" in r.error for r in unprepared.values())
    assert [(op, errors) for op, _, errors in timings] == [("prepare", 2), ("unprepare", 2)]


def test_malformed_result_fails_only_its_claim(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    preparer.prepared["uid-0"] = contract.PrepareResult(devices=_devices(1, share=False))
    bad = contract.PreparedDevice(("gpu",), "pool", "dev", (42,), None)  # type: ignore[arg-type]
    preparer.prepared["uid-1"] = contract.PrepareResult(devices=(bad,))
    with _connect(plugin, V1) as client:
        prepared = client.prepare([_claim(0), _claim(1)])
    assert prepared["uid-0"].devices
    assert prepared["uid-1"].error.startswith("invalid prepare result")


def test_duplicate_uids_and_empty_request(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    claim = _claim(7)
    preparer.prepared[claim.uid] = contract.PrepareResult(devices=_devices(1, share=False))
    with _connect(plugin, V1) as client:
        assert set(client.prepare([claim, claim])) == {claim.uid}
        assert client.prepare([]) == {}
    assert preparer.calls == [("prepare", [claim])]


def test_failing_timing_hook_does_not_fail_the_call(short_dir: Path, preparer: FakePreparer) -> None:
    def broken(op: str, seconds: float, errors: int) -> None:
        raise ValueError("metrics down")

    srv = server.PluginServer(DRIVER, preparer, registry_dir=short_dir / "r", plugin_dir=short_dir / "p", timing=broken)
    with srv, kubelet_client.KubeletPluginClient(str(srv.dra_socket), timeout=10) as client:
        assert client.unprepare([_claim(1)]) == {"uid-1": contract.UnprepareResult()}


# --- health ----------------------------------------------------------------------------------------


def test_grpc_health_serving(plugin: server.PluginServer) -> None:
    with kubelet_client.KubeletPluginClient(str(plugin.dra_socket), timeout=10) as client:
        assert client.check_health() == "SERVING"
        assert client.check_health("k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin") == "SERVING"
        with pytest.raises(grpc.RpcError) as err:
            client.check_health("no.such.Service")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_stream_delivers_updates(plugin: server.PluginServer, board: health_board.HealthBoard) -> None:
    with _connect(plugin, V1) as client:
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
