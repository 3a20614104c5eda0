"""driver.prepare.imex_claims: a claim gets its gang's IMEX channel only when the controller's object names it.

Through the real prepare (DeviceState on the simulator's gb200-nvl72 tray, the CDI spec read back): the named
claim's spec carries its channel's node and environment and no other channel; a claim nobody names gets
none; a prepare waits (retryable error, nothing touched) while the domain's status says a node is not
ready; a garbled or hostile object is refused whole and never crashes the driver.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuplane.api import imex
from gpuplane.driver.hw import sim_devnodes
from gpuplane.driver.prepare import imex_channel, imex_claims
from testing import driverkit

NODE = "tray-0"
PEER = "tray-1"


def claim_entry(name: str, uid: str, node: str, ns: str = "team") -> dict[str, Any]:
    return {"namespace": ns, "name": name, "uid": uid, "node": node}


def domain(
    name: str = "imex-g1",
    gangs: Sequence[dict[str, Any]] = (),
    nodes: Sequence[str] = (NODE, PEER),
    generation: int = 1,
    status: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": imex.API_VERSION,
        "kind": imex.KIND,
        "metadata": {"name": name, "namespace": imex.NAMESPACE, "generation": generation},
        "spec": {"clique": "cluster-1.0", "nodes": list(nodes), "gangs": list(gangs)},
    }
    if status is not None:
        obj["status"] = {"nodes": list(status)}
    return obj


def gang(name: str, channel: int, *claims: dict[str, Any], ns: str = "team") -> dict[str, Any]:
    return {"namespace": ns, "name": name, "uid": f"uid-{name}", "channel": channel, "claims": list(claims)}


@pytest.fixture
def drv() -> Iterator[tuple[driverkit.DriverUnderTest, list[Any]]]:
    """A gb200 tray's driver whose Gate lists ``objects`` (the test fills it)."""
    objects: list[Any] = []
    with driverkit.driver_env("gb200-nvl72", NODE, prefix="imx") as d:
        settings = imex_claims.Settings(
            node=NODE, dev_dir=d.sim.device_node_dir(), proc_devices=d.sim.proc_devices, placeholder_ok=True
        )
        d.state.imex = imex_claims.Gate(lambda: copy.deepcopy(objects), settings)
        yield d, objects


def prepared(d: driverkit.DriverUnderTest, name: str, uid: str, device: str = "gpu-0") -> tuple[str, dict[str, Any]]:
    return driverkit.prepare_cdi(d, name, NODE, uid, device)


def imex_of(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    edits = spec.get("containerEdits") or {}
    nodes = [n["path"] for n in edits.get("deviceNodes") or [] if "imex" in n["path"]]
    env = [e for e in edits.get("env") or [] if e.startswith("GPUPLANE_IMEX_")]
    return nodes, env


def test_a_named_claim_gets_its_gangs_channel_node_and_environment_alone(
    drv: tuple[driverkit.DriverUnderTest, list[Any]],
) -> None:
    d, objects = drv
    objects.append(
        domain(
            gangs=[
                gang("g1", 3, claim_entry("g1-0", "u-a", NODE), claim_entry("g1-1", "u-peer", PEER)),
                gang("g2", 4, claim_entry("g2-0", "u-b", NODE), claim_entry("g2-1", "u-peer2", PEER)),
            ]
        )
    )
    error, spec = prepared(d, "g1-0", "u-a", "gpu-0")
    assert error == ""
    assert imex_of(spec) == (
        ["/dev/nvidia-caps-imex-channels/channel3"],
        ["GPUPLANE_IMEX_CHANNEL=3", "GPUPLANE_IMEX_DOMAIN=imex-g1"],
    )
    host = d.sim.device_node_dir() / "nvidia-caps-imex-channels" / "channel3"
    assert host.exists()  # made from /proc/devices (a placeholder without CAP_MKNOD)
    host_paths = [n.get("hostPath") for n in spec["containerEdits"]["deviceNodes"] if "imex" in n["path"]]
    assert host_paths == [str(host)]
    rec = d.state.snapshot().claims["u-a"]
    assert (rec.imex_channel, rec.imex_domain) == (3, "imex-g1")

    error, spec = prepared(d, "g2-0", "u-b", "gpu-1")
    assert error == "" and imex_of(spec)[0] == ["/dev/nvidia-caps-imex-channels/channel4"]


def test_a_claim_nobody_names_gets_no_channel(drv: tuple[driverkit.DriverUnderTest, list[Any]]) -> None:
    d, objects = drv
    objects.append(domain(gangs=[gang("g1", 3, claim_entry("g1-0", "u-a", NODE))]))
    error, spec = prepared(d, "mine", "u-tenant")  # same node, same namespace, not in the plan
    assert error == "" and imex_of(spec) == ([], [])
    assert d.state.snapshot().claims["u-tenant"].imex_channel is None


def test_a_claim_named_on_another_node_gets_nothing_here(drv: tuple[driverkit.DriverUnderTest, list[Any]]) -> None:
    d, objects = drv
    objects.append(domain(gangs=[gang("g1", 3, claim_entry("g1-1", "u-x", PEER))]))
    error, spec = prepared(d, "g1-1", "u-x")
    assert error == "" and imex_of(spec) == ([], [])


def test_a_prepare_waits_until_every_node_of_the_domain_reports_ready(
    drv: tuple[driverkit.DriverUnderTest, list[Any]],
) -> None:
    d, objects = drv
    gangs = [gang("g1", 3, claim_entry("g1-0", "u-a", NODE), claim_entry("g1-1", "u-p", PEER))]
    objects.append(domain(gangs=gangs, generation=2, status=[{"node": NODE, "ready": True, "observedGeneration": 2}]))
    error, _ = prepared(d, "g1-0", "u-a")
    assert "IMEX domain imex-g1 is not ready on node(s) tray-1" in error and "retried" in error
    assert "u-a" not in d.state.snapshot().claims and d.cdi_files() == []  # nothing made
    assert not (d.sim.device_node_dir() / "nvidia-caps-imex-channels" / "channel3").exists()

    stale = [
        {"node": NODE, "ready": True, "observedGeneration": 2},
        {"node": PEER, "ready": True, "observedGeneration": 1},
    ]
    objects[0] = domain(gangs=gangs, generation=2, status=stale)  # ready, but for the spec before this one
    error, _ = prepared(d, "g1-0", "u-a")
    assert "not ready on node(s) tray-1" in error

    ready = [{"node": n, "ready": True, "observedGeneration": 2} for n in (NODE, PEER)]
    objects[0] = domain(gangs=gangs, generation=2, status=ready)
    error, spec = prepared(d, "g1-0", "u-a")
    assert error == "" and imex_of(spec)[0] == ["/dev/nvidia-caps-imex-channels/channel3"]


def test_not_ready_without_status_waits_only_when_required() -> None:
    model, _ = imex.parse_domain(domain(gangs=[gang("g1", 3, claim_entry("g1-0", "u-a", NODE))]))
    assert model is not None
    assert imex_claims.not_ready(model) == ()  # no daemon reports yet (not built): no wait
    assert imex_claims.not_ready(model, require_status=True) == (NODE, PEER)


def hostile_objects() -> list[Any]:
    base = domain(gangs=[gang("g1", 3, claim_entry("g1-0", "u-a", NODE))])
    channel_zero = copy.deepcopy(base)
    channel_zero["spec"]["gangs"][0]["channel"] = 0
    other_namespace = copy.deepcopy(base)
    other_namespace["spec"]["gangs"][0]["claims"][0]["namespace"] = "victim"
    extra_field = copy.deepcopy(base)
    extra_field["spec"]["gangs"][0]["hostPath"] = "/etc"
    bad_generation = copy.deepcopy(base)
    bad_generation["metadata"]["generation"] = "many"
    deep: Any = {}
    for _ in range(200):
        deep = {"x": deep}
    nested = copy.deepcopy(base)
    nested["spec"]["gangs"][0]["claims"][0]["node"] = deep
    return [
        channel_zero,
        other_namespace,
        extra_field,
        bad_generation,
        nested,
        "not an object",
        None,
        {"metadata": "x"},
        {"metadata": {"name": 7}, "spec": []},
    ]


@pytest.mark.parametrize("index", range(len(hostile_objects())))
def test_a_garbled_object_is_refused_whole_and_the_prepare_goes_on(
    drv: tuple[driverkit.DriverUnderTest, list[Any]], index: int
) -> None:
    d, objects = drv
    objects.append(hostile_objects()[index])
    error, spec = prepared(d, "g1-0", "u-a")
    assert error == "" and imex_of(spec) == ([], [])


def test_two_domains_on_one_node_give_no_channel_and_say_why(drv: tuple[driverkit.DriverUnderTest, list[Any]]) -> None:
    d, objects = drv
    objects.append(domain("imex-a", gangs=[gang("ga", 3, claim_entry("ga-0", "u-a", NODE))]))
    objects.append(domain("imex-b", gangs=[gang("gb", 4, claim_entry("gb-0", "u-b", NODE))]))
    error, _ = prepared(d, "ga-0", "u-a")
    assert "no IMEX channel given" in error and "more than one IMEX domain" in error
    assert "u-a" not in d.state.snapshot().claims


def test_an_unreadable_plan_fails_the_prepare_retryably(drv: tuple[driverkit.DriverUnderTest, list[Any]]) -> None:
    d, _ = drv

    def broken() -> list[Any]:
        raise OSError("connection refused")

    d.state.imex = imex_claims.Gate(broken, imex_claims.Settings(node=NODE, dev_dir=d.sim.device_node_dir()))
    error, _ = prepared(d, "any", "u-any")
    assert "cannot read the ImexDomain objects" in error and "connection refused" in error


def test_an_hgx_node_never_reads_the_plan_and_prepares_when_the_read_would_fail() -> None:
    """No GPU of an HGX node has multi-node NVLink, so no domain can name its claims: no read, no failure."""
    asked: list[str] = []

    def broken() -> list[Any]:
        asked.append("list")
        raise OSError("forbidden: no Role gpuplane-driver-imex")

    with driverkit.driver_env("hgx-h100", "hgx-0", prefix="imh") as d:
        assert d.state.inventory().gpus and not any(g.multi_node for g in d.state.inventory().gpus)
        d.state.imex = imex_claims.Gate(broken, imex_claims.Settings(node="hgx-0", dev_dir=d.sim.device_node_dir()))
        c = driverkit.make_claim("solo", "hgx-0", ["gpu-0", "gpu-1"], namespace="team", uid="u-hgx")
        d.claims.add(c)
        assert d.state.prepare([driverkit.ref(c)])["u-hgx"].error == ""
        assert asked == []  # the read was never made
        assert d.state.snapshot().claims["u-hgx"].imex_channel is None


def test_a_tray_reads_the_plan_for_its_fabric_gpus_and_only_then_fails_on_a_failed_read(
    drv: tuple[driverkit.DriverUnderTest, list[Any]],
) -> None:
    d, _ = drv
    inv = d.state.inventory()
    assert inv.gpus and all(g.multi_node for g in inv.gpus)  # a gb200 tray: every GPU in the rack's clique
    asked: list[str] = []

    def broken() -> list[Any]:
        asked.append("list")
        raise OSError("connection refused")

    gate = imex_claims.Gate(broken, imex_claims.Settings(node=NODE, dev_dir=d.sim.device_node_dir()))
    assert gate.channel("u-x", []) is None and asked == []  # no GPU: nothing to read
    local = [dataclasses.replace(g, multi_node=False) for g in inv.gpus]  # the fabric down: local NVLink only
    assert gate.channel("u-x", local) is None and asked == []
    with pytest.raises(imex_claims.ImexWait, match="connection refused"):
        gate.channel("u-x", inv.gpus[:1])
    assert asked == ["list"]


def test_a_node_without_imex_channels_fails_a_named_claim_with_what_to_do(
    drv: tuple[driverkit.DriverUnderTest, list[Any]], tmp_path: Path
) -> None:
    d, objects = drv
    objects.append(domain(gangs=[gang("g1", 3, claim_entry("g1-0", "u-a", NODE))]))
    old = tmp_path / "devices"
    old.write_text("Character devices:\n195 nvidia-frontend\n")
    settings = imex_claims.Settings(node=NODE, dev_dir=d.sim.device_node_dir(), proc_devices=old, placeholder_ok=True)
    d.state.imex = imex_claims.Gate(lambda: objects, settings)
    error, _ = prepared(d, "g1-0", "u-a")
    assert "no IMEX channels" in error and "u-a" not in d.state.snapshot().claims


def test_a_rebuilt_spec_keeps_the_channel(drv: tuple[driverkit.DriverUnderTest, list[Any]]) -> None:
    d, objects = drv
    objects.append(domain(gangs=[gang("g1", 5, claim_entry("g1-0", "u-a", NODE))]))
    assert prepared(d, "g1-0", "u-a")[0] == ""
    for f in d.cdi_files():
        f.unlink()  # /var/run is tmpfs: the spec is gone, the record is not
    objects.clear()  # and the plan moved on: the claim keeps what it was given
    c = d.claims.get_claim("team", "g1-0")
    assert d.state.prepare([driverkit.ref(c)])["u-a"].error == ""
    (spec_file,) = d.cdi_files()
    assert imex_of(json.loads(spec_file.read_text()))[0] == ["/dev/nvidia-caps-imex-channels/channel5"]


def test_the_simulators_major_is_the_one_the_channel_node_is_made_with(tmp_path: Path) -> None:
    proc = tmp_path / "devices"
    proc.write_text(sim_devnodes.proc_devices_text())
    path = imex_channel.ensure_node(tmp_path / "dev", proc, 9, placeholder_ok=True)
    assert path == tmp_path / "dev" / "nvidia-caps-imex-channels" / "channel9" and path.exists()
