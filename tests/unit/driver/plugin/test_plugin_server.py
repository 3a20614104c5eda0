"""PluginServer over real unix sockets, driven by the kubelet-side client and raw stubs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from gpuplane.driver._proto.dra.v1 import api_pb2 as v1_pb2
from gpuplane.driver._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from gpuplane.driver.plugin import dra_servicer, kubelet_client, server
from gpuplane.driver.prepare import contract
from tests.pluginkit import (
    DRIVER,
    V1,
    V1BETA1,
    FakePreparer,
    board_fixture,  # noqa: F401  (fixture board)
    claim_ref,
    connect,
    plugin_fixture,  # noqa: F401  (fixture plugin)
    prepared_devices,
    preparer_fixture,  # noqa: F401  (fixture preparer)
    short_dir_fixture,  # noqa: F401  (fixture short_dir)
    timings_fixture,  # noqa: F401  (fixture timings)
)

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
    client = connect(plugin, V1)
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
    claim = claim_ref(1)
    preparer.prepared[claim.uid] = contract.PrepareResult(devices=prepared_devices(n_devices, share=True))
    with connect(plugin, version) as client:
        assert client.version == version
        got = client.prepare([claim])
        expected = prepared_devices(n_devices, share=version == V1)  # v1beta1 has no share_id
        assert got == {claim.uid: contract.PrepareResult(devices=expected)}
        assert client.unprepare([claim]) == {claim.uid: contract.UnprepareResult()}
    assert preparer.calls == [("prepare", [claim]), ("unprepare", [claim])]
    assert [(op, errors) for op, _, errors in timings] == [("prepare", 0), ("unprepare", 0)]


def test_rpc_timing_covers_the_preparer_call(
    plugin: server.PluginServer, preparer: FakePreparer, timings: list[tuple[str, float, int]]
) -> None:
    """The seconds reported for a call include the preparer's work and no more than the client waited."""
    claim = claim_ref(1)
    preparer.prepared[claim.uid] = contract.PrepareResult(devices=prepared_devices(1, share=True))
    preparer.delay_s = 0.05
    with connect(plugin, V1) as client:
        started = time.perf_counter()
        client.prepare([claim])
        waited = time.perf_counter() - started
    ((op, seconds, errors),) = timings
    assert (op, errors) == ("prepare", 0)
    assert preparer.delay_s <= seconds <= waited, (seconds, waited)


def test_share_id_absent_stays_absent(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    claim = claim_ref(1)
    preparer.prepared[claim.uid] = contract.PrepareResult(devices=prepared_devices(2, share=False))
    with connect(plugin, V1) as client:
        assert client.prepare([claim])[claim.uid].devices == prepared_devices(2, share=False)


def test_raw_v1_method_path_and_share_id_on_wire(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    preparer.prepared["u"] = contract.PrepareResult(devices=prepared_devices(1, share=True))
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
    claims = [claim_ref(i) for i in range(4)]
    for c in claims:
        preparer.prepared[c.uid] = contract.PrepareResult(devices=prepared_devices(1, share=False))
    preparer.prepared["uid-2"] = contract.PrepareResult(error="MIG instance creation failed")
    preparer.unprepare_errors["uid-3"] = "device busy"
    with connect(plugin, version) as client:
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
    claims = [claim_ref(i) for i in range(3)]
    for c in claims:
        preparer.prepared[c.uid] = contract.PrepareResult(devices=prepared_devices(1, share=False))
    preparer.omit = {"uid-1"}
    with connect(plugin, V1) as client:
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
    claims = [claim_ref(i) for i in range(2)]
    with connect(plugin, V1BETA1) as client:
        prepared = client.prepare(claims)
        unprepared = client.unprepare(claims)
    assert set(prepared) == set(unprepared) == {"uid-0", "uid-1"}
    assert all("RuntimeError: apiserver unreachable" in r.error for r in prepared.values())
    assert all("apiserver unreachable" in r.error for r in unprepared.values())
    assert [(op, errors) for op, _, errors in timings] == [("prepare", 2), ("unprepare", 2)]


def test_malformed_result_fails_only_its_claim(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    preparer.prepared["uid-0"] = contract.PrepareResult(devices=prepared_devices(1, share=False))
    bad = contract.PreparedDevice(("gpu",), "pool", "dev", (42,), None)  # type: ignore[arg-type]
    preparer.prepared["uid-1"] = contract.PrepareResult(devices=(bad,))
    with connect(plugin, V1) as client:
        prepared = client.prepare([claim_ref(0), claim_ref(1)])
    assert prepared["uid-0"].devices
    assert prepared["uid-1"].error.startswith("invalid prepare result")


def test_duplicate_uids_and_empty_request(plugin: server.PluginServer, preparer: FakePreparer) -> None:
    claim = claim_ref(7)
    preparer.prepared[claim.uid] = contract.PrepareResult(devices=prepared_devices(1, share=False))
    with connect(plugin, V1) as client:
        assert set(client.prepare([claim, claim])) == {claim.uid}
        assert client.prepare([]) == {}
    assert preparer.calls == [("prepare", [claim])]


def test_failing_timing_hook_does_not_fail_the_call(short_dir: Path, preparer: FakePreparer) -> None:
    def broken(op: str, seconds: float, errors: int) -> None:
        raise ValueError("metrics down")

    srv = server.PluginServer(DRIVER, preparer, registry_dir=short_dir / "r", plugin_dir=short_dir / "p", timing=broken)
    with srv, kubelet_client.KubeletPluginClient(str(srv.dra_socket), timeout=10) as client:
        assert client.unprepare([claim_ref(1)]) == {"uid-1": contract.UnprepareResult()}


# --- shutdown -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("grace", "finishes"), [(5.0, True), (0.05, False)])
def test_stop_lets_a_running_prepare_finish_within_the_grace(
    short_dir: Path, preparer: FakePreparer, grace: float, finishes: bool
) -> None:
    """A rollout stops the old driver while kubelet waits on its prepare (an MPS prepare waits for its daemon pod).

    Within the grace the call completes; past it, it is cut (kubelet retries on the new driver).
    """
    ref = claim_ref(0)
    preparer.prepared[ref.uid] = contract.PrepareResult(devices=prepared_devices(1, False))
    preparer.delay_s = 1.0
    srv = server.PluginServer(DRIVER, preparer, registry_dir=short_dir / "r", plugin_dir=short_dir / "p")
    srv.start()
    outcome: list[object] = []
    client = kubelet_client.KubeletPluginClient(str(srv.dra_socket), timeout=10)

    def call() -> None:
        try:
            outcome.append(client.prepare([ref]))
        except grpc.RpcError as err:
            outcome.append(err.code())

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 5
    while not preparer.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert preparer.calls, "the prepare reached the driver"
    srv.stop(grace=grace)
    caller.join(10)
    client.close()
    (got,) = outcome
    if finishes:
        assert isinstance(got, dict) and got[ref.uid].error == "", got
        assert [d.device_name for d in got[ref.uid].devices] == ["gpu-0"]
    else:
        assert got in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), got
