"""ResourceSlices for every simulator profile: API limits (checked twice), attributes, NVLink domains, stable names.

Every pool is built the production way (simulator -> ``discover`` -> ``build_pool`` -> ``render_slices``)
and checked by ``validate_pool`` *and* by an independent re-statement of the 1.36 validation rules
in :mod:`tests.slicerules`, so a bug shared by the builder and its own checker still fails a test.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuplane.api import names
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import Inventory, discover
from gpuplane.driver.publish.slices import DeviceTaint, build_pool, render_slices, validate_pool
from gpuplane.mig import geometry, models
from testing.driverkit import simulator
from tests.slicerules import SEMVER, api_violations, dns_subdomain

CLUSTER = "6f1c2d3e-4b5a-4978-8a9b-0c1d2e3f4a5b"
ALL_MIG_ON = {i: True for i in range(8)}


# --- building pools ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    id: str
    profile: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    gpus: int = 8
    mig: bool = True  # MIG devices (and counter sets) published
    whole: bool = True  # whole-GPU devices published
    mig_per_gpu: int = 25  # 7 + 7 + 4 + 3 + 2 + 1 + 1 placements


CASES = (
    Case("hgx-h100", "hgx-h100"),
    Case("hgx-h200", "hgx-h200"),
    Case("h100-nvl-pcie", "h100-nvl-pcie", gpus=4),
    Case("gb200-nvl72", "gb200-nvl72", {"cluster_uuid": CLUSTER, "clique_id": 7}, gpus=4),
    Case("a100-40gb-mig-off", "a100-40gb", mig=False),  # enabling MIG needs a reset: offered whole only
    Case("a100-40gb-mig-on", "a100-40gb", {"initial_mig_mode": ALL_MIG_ON}, whole=False),
    Case("pcie-l4", "pcie-l4", gpus=4, mig=False),
)


def pool_of(sim: Simulator, node: str = "node-a", generation: int = 3, **kw: Any) -> list[dict[str, Any]]:
    return render_slices(build_pool(discover(node, sim), **kw), generation)


def devices_of(slices: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def attr(device: Mapping[str, Any], key: str) -> Any:
    (value,) = device["attributes"][key].values()
    return value


@pytest.fixture(params=CASES, ids=lambda c: c.id)
def case(request: pytest.FixtureRequest) -> Case:
    c: Case = request.param
    return c


# --- every profile ----------------------------------------------------------------------------------------
def test_every_profile_is_within_api_limits(case: Case) -> None:
    with simulator(case.profile, **case.overrides) as sim:
        slices = pool_of(sim, generation=5)
    validate_pool(slices)
    assert api_violations(slices) == []
    assert {s["spec"]["pool"]["generation"] for s in slices} == {5}
    assert all(s["spec"]["nodeName"] == "node-a" and s["spec"]["driver"] == names.DRIVER_NAME for s in slices)
    assert all(dns_subdomain(s["metadata"]["name"]) for s in slices)
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)

    devices = devices_of(slices)
    counter_slices = [s for s in slices if s["spec"].get("sharedCounters")]
    whole = sorted(n for n, d in devices.items() if attr(d, names.ATTR_TYPE) == "gpu")
    mig = [n for n, d in devices.items() if attr(d, names.ATTR_TYPE) == "mig"]
    assert whole == (sorted(f"gpu-{i}" for i in range(case.gpus)) if case.whole else [])
    assert len(mig) == (case.gpus * case.mig_per_gpu if case.mig else 0)
    # Counter sets packed 8 to a slice (the API's limit): one counter slice per 8 GPUs.
    assert len(counter_slices) == (-(-case.gpus // 8) if case.mig else 0)
    assert sum(len(s["spec"]["sharedCounters"]) for s in counter_slices) == (case.gpus if case.mig else 0)
    # A GPU's devices never straddle two slices (a slice is the unit the scheduler sees updated together).
    for i in range(case.gpus):
        holders = {
            s["metadata"]["name"]
            for s in slices
            for d in s["spec"].get("devices") or []
            if d["name"] == f"gpu-{i}" or d["name"].startswith(f"gpu-{i}-")
        }
        assert len(holders) == 1, f"gpu-{i} spread over {holders}"


def test_required_attributes_and_capacities(case: Case) -> None:
    with simulator(case.profile, **case.overrides) as sim:
        infos = {g.minor: g for g in sim.gpus()}
        slices = pool_of(sim)
    for name, d in devices_of(slices).items():
        attrs, caps = d["attributes"], d["capacity"]
        is_mig = attr(d, names.ATTR_TYPE) == "mig"
        minor = attr(d, names.ATTR_PARENT_MINOR) if is_mig else attr(d, names.ATTR_MINOR)
        info = infos[minor]
        for key in (names.ATTR_PRODUCT_NAME, names.ATTR_ARCHITECTURE, names.ATTR_NVLINK_DOMAIN, names.ATTR_PCI_BUS_ID):
            assert "string" in attrs[key], f"{name}: {key}"
        for key in (names.ATTR_CUDA_CC, names.ATTR_DRIVER_VERSION):
            assert SEMVER.match(attrs[key]["version"]), f"{name}: {key}"
        assert attrs[names.ATTR_PRODUCT_NAME]["string"] == info.product_name
        assert attrs[names.ATTR_PCI_BUS_ID]["string"] == info.pci_bus_id
        assert attrs[names.ATTR_DRIVER_VERSION]["version"] == "570.124.6"
        assert attrs[names.ATTR_CUDA_CC]["version"] == info.cuda_compute_capability + ".0"
        assert set(caps) >= {names.CAP_MEMORY, names.CAP_MULTIPROCESSORS}
        if is_mig:
            # A dynamic MIG device has no uuid until prepare creates it; its parent's uuid is published.
            assert attrs[names.ATTR_PARENT_UUID]["string"] == info.uuid
            assert names.ATTR_UUID not in attrs
            profile = attrs[names.ATTR_MIG_PROFILE]["string"]
            assert (
                name == f"gpu-{minor}-mig-{profile.replace('.', '-').replace('+', '-')}-"
                f"{attrs[names.ATTR_MIG_PLACEMENT]['int']}"
            )
            assert int(caps[names.CAP_MEMORY]["value"]) < info.memory_bytes
        else:
            assert attrs[names.ATTR_UUID]["string"] == info.uuid
            assert int(caps[names.CAP_MEMORY]["value"]) == info.memory_bytes
            assert int(caps[names.CAP_MULTIPROCESSORS]["value"]) == info.multiprocessors
            assert d["allowMultipleAllocations"] is True
            # No share asked: all of it; a share is a whole 1..100 (the scheduler rounds "0" up to 1).
            assert caps[names.CAP_SHARE_PERCENT] == {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
            }
            assert caps[names.CAP_MEMORY]["requestPolicy"] == {"default": "0"}


@pytest.mark.parametrize("case", [c for c in CASES if c.mig], ids=lambda c: c.id)
def test_counter_sets_match_the_mig_geometry(case: Case) -> None:
    with simulator(case.profile, **case.overrides) as sim:
        inv = discover("node-a", sim)
        slices = render_slices(build_pool(inv), 1)
    sets = {cs["name"]: cs["counters"] for s in slices for cs in s["spec"].get("sharedCounters") or []}
    for gpu in inv.gpus:
        counters = sets[f"{gpu.name}-counters"]
        assert {f"memory-slice-{i}" for i in range(8)} <= set(counters)
        assert counters["compute-slices"] == {"value": "7"}
        assert counters["memory"] == {"value": str(gpu.info.memory_bytes)}
    for name, d in devices_of(slices).items():
        (use,) = d["consumesCounters"]
        if attr(d, names.ATTR_TYPE) == "gpu":
            assert use["counters"] == sets[use["counterSet"]], "the whole GPU consumes every counter"
            continue
        start = attr(d, names.ATTR_MIG_PLACEMENT)
        profile = next(p for p in inv.gpus[0].profiles if p.name == attr(d, names.ATTR_MIG_PROFILE))
        slots = {k for k in use["counters"] if k.startswith("memory-slice-")}
        assert slots == {f"memory-slice-{i}" for i in range(start, start + profile.memory_slices)}, name
        assert use["counters"]["compute-slices"] == {"value": str(profile.compute_slices)}


# --- NVLink domains ---------------------------------------------------------------------------------------
def _domains(slices: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Device name -> nvlinkDomain for every device."""
    return {n: attr(d, names.ATTR_NVLINK_DOMAIN) for n, d in devices_of(slices).items()}


@pytest.mark.parametrize("profile", ["hgx-h100", "hgx-h200"])
def test_hgx_is_one_domain_per_node(profile: str) -> None:
    with simulator(profile, "node-a") as a, simulator(profile, "node-b") as b:
        dom_a, dom_b = _domains(pool_of(a, "node-a")), _domains(pool_of(b, "node-b"))
    assert len(set(dom_a.values())) == 1 and len(set(dom_b.values())) == 1
    assert set(dom_a.values()) != set(dom_b.values()), "NVSwitch domains end at the node"


def test_h100_nvl_pcie_pairs() -> None:
    with simulator("h100-nvl-pcie") as sim:
        dom = _domains(pool_of(sim))
    assert dom["gpu-0"] == dom["gpu-1"] == dom["gpu-0-mig-7g-94gb-0"]
    assert dom["gpu-2"] == dom["gpu-3"]
    assert dom["gpu-0"] != dom["gpu-2"]
    assert len(set(dom.values())) == 2


def test_gb200_domain_is_the_fabric_clique_shared_across_nodes() -> None:
    rack = {"cluster_uuid": CLUSTER, "clique_id": 7}
    with (
        simulator("gb200-nvl72", "rack1-n01", **rack) as a,
        simulator("gb200-nvl72", "rack1-n02", **rack) as b,
        simulator("gb200-nvl72", "rack1-n03", cluster_uuid=CLUSTER, clique_id=8) as c,
    ):
        dom_a = _domains(pool_of(a, "rack1-n01"))
        dom_b = _domains(pool_of(b, "rack1-n02"))
        dom_c = _domains(pool_of(c, "rack1-n03"))
    assert set(dom_a.values()) == set(dom_b.values()) == {f"{CLUSTER}.7"}
    assert set(dom_c.values()) == {f"{CLUSTER}.8"}


def test_l4_is_one_domain_per_gpu() -> None:
    with simulator("pcie-l4") as sim:
        dom = _domains(pool_of(sim))
    assert len(dom) == 4 and len(set(dom.values())) == 4


# --- stable names -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["hgx-h100", "pcie-l4"])
def test_names_stay_stable_when_a_gpu_falls_off_the_bus(profile: str) -> None:
    with simulator(profile) as full, simulator(profile, absent_minors=(1,)) as degraded:
        before = devices_of(pool_of(full))
        after = devices_of(pool_of(degraded))
        assert [g.minor for g in degraded.gpus()][:3] == [0, 2, 3]
        assert [g.index for g in degraded.gpus()][:3] == [0, 1, 2], "NVML indexes shift"
    lost = {n for n in before if n == "gpu-1" or n.startswith("gpu-1-")}
    assert lost and set(after) == set(before) - lost
    for name in after:
        assert after[name]["attributes"] == before[name]["attributes"], name
    validate_pool(pool_of_devices_only(after))


def pool_of_devices_only(devices: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A one-slice pool of plain devices (counters stripped), for validate_pool on a device subset."""
    stripped = [{k: v for k, v in d.items() if k != "consumesCounters"} for d in devices.values()][:64]
    spec = {"driver": names.DRIVER_NAME, "nodeName": "n", "devices": stripped}
    return [
        {"metadata": {"name": "n-0"}, "spec": {**spec, "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1}}}
    ]


def test_no_gpus_left_still_publishes_an_empty_pool() -> None:
    with simulator("pcie-l4", absent_minors=(0, 1, 2, 3)) as sim:
        slices = pool_of(sim)
    assert [s["spec"].get("devices") for s in slices] == [[]]
    validate_pool(slices)


# --- administrator MIG instances --------------------------------------------------------------------------
def test_admin_mig_instance_is_a_fixed_device() -> None:
    with simulator("hgx-h100", initial_mig_mode={0: True}) as sim:
        uuid = sim.uuid_of_minor(0)
        gi = sim.create_gpu_instance(uuid, geometry.GI_PROFILE_3_SLICE, 4)
        gi = sim.create_compute_instance(uuid, gi.gi_id)
        # An incomplete admin GI (no compute instance) blocks its slots and is not offered.
        sim.create_gpu_instance(uuid, geometry.GI_PROFILE_1_SLICE, 0)
        inv = discover("node-a", sim)
        slices = render_slices(build_pool(inv), 1)
    validate_pool(slices)
    assert api_violations(slices) == []
    devices = devices_of(slices)
    gpu0 = {n: d for n, d in devices.items() if n.startswith("gpu-0")}
    assert "gpu-0" not in gpu0, "a GPU with admin instances is not offered whole"
    static = {n for n, d in gpu0.items() if attr(d, names.ATTR_MIG_STATIC)}
    assert static == {"gpu-0-mig-3g-40gb-4"}
    fixed = gpu0["gpu-0-mig-3g-40gb-4"]
    assert attr(fixed, names.ATTR_UUID) == gi.mig_uuid
    (use,) = fixed["consumesCounters"]
    assert {k for k in use["counters"] if k.startswith("memory-slice-")} == {f"memory-slice-{i}" for i in range(4, 8)}
    # Dynamic placements: exactly those clear of slots 0 (incomplete GI) and 4-7 (admin 3g).
    model = models.H100_80GB
    expected = {
        f"gpu-0-mig-{p.name.replace('.', '-').replace('+', '-')}-{s}"
        for p in model.profiles
        for s in p.placements
        if not set(range(s, s + p.memory_slices)) & {0, 4, 5, 6, 7}
    }
    assert expected == {
        "gpu-0-mig-1g-10gb-1",
        "gpu-0-mig-1g-10gb-2",
        "gpu-0-mig-1g-10gb-3",
        "gpu-0-mig-1g-10gb-me-1",
        "gpu-0-mig-1g-10gb-me-2",
        "gpu-0-mig-1g-10gb-me-3",
        "gpu-0-mig-1g-20gb-2",
        "gpu-0-mig-2g-20gb-2",
    }
    assert set(gpu0) - static == expected
    assert not any(attr(d, names.ATTR_MIG_STATIC) for n, d in devices.items() if n.startswith("gpu-1-mig"))
    assert "gpu-1" in devices and "gpu-1-mig-7g-80gb-0" in devices


def test_driver_owned_instance_is_not_an_admin_one() -> None:
    with simulator("hgx-h100", initial_mig_mode={0: True}) as sim:
        uuid = sim.uuid_of_minor(0)
        gi = sim.create_compute_instance(uuid, sim.create_gpu_instance(uuid, geometry.GI_PROFILE_3_SLICE, 4).gi_id)
        owned: Inventory = discover("node-a", sim, [(uuid, gi.gi_id)])
    gpu0 = owned.gpus[0]
    assert gpu0.offer_whole and all(s.static_instance is None for s in gpu0.mig_slots)
    assert len(gpu0.mig_slots) == 25


# --- taints and the checker itself ------------------------------------------------------------------------
def test_taints_keep_slices_within_limits() -> None:
    with simulator("pcie-l4") as sim:
        inv = discover("node-a", sim)
    taint = DeviceTaint("gpu.gpuplane.dev/xid", "79", "NoExecute")
    slices = render_slices(build_pool(inv, taints={"gpu-2": [taint]}), 1)
    validate_pool(slices)
    assert api_violations(slices) == []
    assert devices_of(slices)["gpu-2"]["taints"] == [
        {"key": "gpu.gpuplane.dev/xid", "value": "79", "effect": "NoExecute"}
    ]


# --- docs/slices.md and scripts/print_slices.py -----------------------------------------------------------
def test_docs_table_is_what_the_script_prints() -> None:
    repo = Path(__file__).resolve().parents[4]
    spec = importlib.util.spec_from_file_location("print_slices", repo / "scripts" / "print_slices.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    table = script.summary_table()
    assert table in (repo / "docs" / "slices.md").read_text(), "regenerate: python scripts/print_slices.py --summary"
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert rows["hgx-h100"].startswith("| hgx-h100 | 8 | 8 | 200 | 208 | 1 | 4 | 5 |")
    assert rows["pcie-l4"].startswith("| pcie-l4 | 4 | 4 | 0 | 4 | 0 | 1 | 1 |")
    example = script.example(script.pool("hgx-h100"), ["gpu-0", "gpu-0-mig-3g-40gb-4"])
    assert [list(s["spec"].get("sharedCounters") or s["spec"]["devices"]) != [] for s in example] == [True, True]
    assert [d["name"] for d in example[1]["spec"]["devices"]] == ["gpu-0", "gpu-0-mig-3g-40gb-4"]


def test_lost_gpu_keeps_its_whole_device_and_the_rest_still_publish(tmp_path: Path) -> None:
    """A GPU that fell off the bus must not take the node's whole inventory down with it."""
    from gpuplane.driver.hw.interface import HealthEventKind

    sim = Simulator(SimConfig(profile="hgx-h100", state_dir=tmp_path / "sim", node_name="lost-node"))
    sim.init()
    try:
        lost = sim.uuid_of_minor(2)
        sim.inject_event(lost, HealthEventKind.GPU_LOST)
        inv = discover("lost-node", sim)
        names = inv.device_names()
        assert "gpu-2" in names
        assert not any(n.startswith("gpu-2-mig-") for n in names)
        assert any(n.startswith("gpu-3-mig-") for n in names)
        pool = render_slices(build_pool(inv), 1)
        validate_pool(pool)
    finally:
        sim.shutdown()
