"""The node driver end to end over its real unix sockets, with a kubelet-side client from the same protos.

Claims come from an in-memory API fake; the simulator stands in for the GPUs;
everything between (gRPC servicers, DeviceState, checkpoint, CDI) is production code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.api import names
from gpuplane.driver.plugin.kubelet_client import KubeletPluginClient
from gpuplane.driver.prepare import cdi
from testing.driverkit import DriverUnderTest, driver_env, make_claim, ref, serving

GPU_CONFIG = {"apiVersion": names.CONFIG_API_VERSION, "kind": "GpuConfig"}


@pytest.fixture
def drv() -> Iterator[DriverUnderTest]:
    with driver_env("hgx-h100", "node-a") as d:
        yield d


@pytest.fixture(params=["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def client(request: pytest.FixtureRequest, drv: DriverUnderTest) -> Iterator[KubeletPluginClient]:
    with serving(drv) as server:
        c = KubeletPluginClient.discover(str(server.registration_socket), force_version=request.param)
        try:
            yield c
        finally:
            c.close()


def test_registration_answers(drv: DriverUnderTest) -> None:
    with serving(drv) as server:
        c = KubeletPluginClient.discover(str(server.registration_socket))
        try:
            assert c.info is not None
            assert c.info.type == "DRAPlugin"
            assert c.info.name == names.DRIVER_NAME
            assert c.info.endpoint == str(server.dra_socket)
            assert list(c.info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            assert c.version == "v1.DRAPlugin"
            assert server.registered.wait(5)
            assert c.check_health() == "SERVING"
        finally:
            c.close()


def _cdi_doc(drv: DriverUnderTest, uid: str) -> dict[str, object]:
    return json.loads(cdi.spec_path(drv.cdi_root, uid).read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("count", [1, 2, 8])
def test_prepare_unprepare_whole_gpus(drv: DriverUnderTest, client: KubeletPluginClient, count: int) -> None:
    devices = [f"gpu-{i}" for i in range(count)]
    claim = make_claim("train", drv.node, devices, class_config=[GPU_CONFIG])
    drv.claims.add(claim)
    result = client.prepare([ref(claim)])[claim["metadata"]["uid"]]
    assert result.error == ""
    assert sorted(d.device_name for d in result.devices) == sorted(devices)
    uid = claim["metadata"]["uid"]
    doc = _cdi_doc(drv, uid)
    uuids = {g.minor: g.uuid for g in drv.sim.gpus()}
    for dev in result.devices:
        assert dev.pool_name == drv.node
        assert dev.request_names == ("gpu",)
        (cdi_id,) = dev.cdi_device_ids
        assert cdi.resolve(drv.cdi_root, cdi_id) == cdi.spec_path(drv.cdi_root, uid)
    env = doc["containerEdits"]["env"]  # type: ignore[index]
    visible = next(e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES="))
    assert sorted(visible.split("=", 1)[1].split(",")) == sorted(uuids[i] for i in range(count))
    nodes = sorted(n["path"] for d in doc["devices"] for n in d["containerEdits"]["deviceNodes"])  # type: ignore[index,union-attr,attr-defined]
    assert nodes == sorted(f"/dev/nvidia{i}" for i in range(count))
    cp = drv.state.snapshot()
    assert cp.claims[uid].phase == "PrepareCompleted"

    assert client.unprepare([ref(claim)])[uid].error == ""
    assert drv.cdi_files() == []
    assert uid not in drv.state.snapshot().claims


def test_batch_with_one_bad_claim(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    good_a = make_claim("a", drv.node, ["gpu-0"])
    good_b = make_claim("b", drv.node, ["gpu-1"])
    bad = make_claim("bad", drv.node, ["gpu-2"], claim_config=[{**GPU_CONFIG, "sharing": {"strategy": "Sometimes"}}])
    drv.claims.add(good_a, good_b, bad)
    results = client.prepare([ref(good_a), ref(bad), ref(good_b)])
    assert set(results) == {c["metadata"]["uid"] for c in (good_a, good_b, bad)}
    assert results[good_a["metadata"]["uid"]].error == ""
    assert results[good_b["metadata"]["uid"]].error == ""
    err = results[bad["metadata"]["uid"]].error
    assert "sharing.strategy" in err and "'Exclusive', 'TimeSlicing' or 'MPS'" in err and "Sometimes" in err
    assert not cdi.spec_path(drv.cdi_root, bad["metadata"]["uid"]).exists()
    assert bad["metadata"]["uid"] not in drv.state.snapshot().claims
    assert any(reason == "PrepareFailed" and name == "bad" for name, reason, _ in drv.claims.events)


def test_unknown_config_field_is_named(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    claim = make_claim("typo", drv.node, ["gpu-0"], claim_config=[{**GPU_CONFIG, "sharng": {}}])
    drv.claims.add(claim)
    err = client.prepare([ref(claim)])[claim["metadata"]["uid"]].error
    assert "sharng" in err and "unknown field" in err
    assert drv.cdi_files() == []


def test_uid_mismatch(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    claim = make_claim("old", drv.node, ["gpu-0"])
    drv.claims.add(claim)
    stale = ref(claim)
    stale = type(stale)(namespace=stale.namespace, uid="00000000-0000-0000-0000-000000000000", name=stale.name)
    err = client.prepare([stale])[stale.uid].error
    assert "UID" in err and "recreated" in err
    assert drv.cdi_files() == []


def test_unallocated_claim(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    claim = make_claim("pending", drv.node, ["gpu-0"], allocated=False)
    drv.claims.add(claim)
    err = client.prepare([ref(claim)])[claim["metadata"]["uid"]].error
    assert "not allocated" in err


def test_missing_claim(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    claim = make_claim("ghost", drv.node, ["gpu-0"])
    err = client.prepare([ref(claim)])[claim["metadata"]["uid"]].error
    assert "not found" in err


def test_device_not_on_this_node(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    claim = make_claim("elsewhere", drv.node, ["gpu-99"])
    drv.claims.add(claim)
    err = client.prepare([ref(claim)])[claim["metadata"]["uid"]].error
    assert "gpu-99" in err and "not published" in err


def test_repeated_prepare_is_safe(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    claim = make_claim("again", drv.node, ["gpu-3", "gpu-4"])
    drv.claims.add(claim)
    uid = claim["metadata"]["uid"]
    first = client.prepare([ref(claim)])[uid]
    gets = drv.claims.gets
    second = client.prepare([ref(claim)])[uid]
    assert first == second
    assert drv.claims.gets == gets, "a prepared claim is answered from the checkpoint"
    assert len(drv.cdi_files()) == 1
    # The spec vanished (e.g. /var/run on tmpfs after a runtime restart): the repeat rebuilds it.
    cdi.spec_path(drv.cdi_root, uid).unlink()
    third = client.prepare([ref(claim)])[uid]
    assert third == first and cdi.spec_path(drv.cdi_root, uid).exists()
    # Unprepare twice: the second is a no-op success.
    assert client.unprepare([ref(claim)])[uid].error == ""
    assert client.unprepare([ref(claim)])[uid].error == ""
    assert drv.cdi_files() == []


def test_unprepare_removes_only_its_claim(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    a = make_claim("a", drv.node, ["gpu-0"])
    b = make_claim("b", drv.node, ["gpu-1"])
    drv.claims.add(a, b)
    client.prepare([ref(a), ref(b)])
    client.unprepare([ref(a)])
    remaining: list[Path] = drv.cdi_files()
    assert remaining == [cdi.spec_path(drv.cdi_root, b["metadata"]["uid"])]


def test_exclusive_gpu_cannot_be_shared(drv: DriverUnderTest, client: KubeletPluginClient) -> None:
    a = make_claim("a", drv.node, [{"device": "gpu-0", "shareID": "s-a"}])
    mps = {**GPU_CONFIG, "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 20}}}
    b = make_claim("b", drv.node, [{"device": "gpu-0", "shareID": "s-b"}], claim_config=[mps])
    drv.claims.add(a, b)
    assert client.prepare([ref(a)])[a["metadata"]["uid"]].error == ""
    err = client.prepare([ref(b)])[b["metadata"]["uid"]].error
    assert "already held by claim default/a" in err and "Exclusive" in err
    assert drv.mps.list_daemons() == []
