"""Right-sizing: a GpuRequest's need -> the ordered DRA alternatives -> the ResourceClaimTemplate and status.

The fleet is read from ResourceSlices built the production way (simulator -> discover ->
build_pool -> render_slices) for the simulator's H100, GB200, A100-40GB and L4 nodes, and the
tier limits from the DeviceClasses in manifests/deviceclasses. Expected profiles are worked out
by hand from the published memory and SM counts, printed beside what the module chose.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuplane.api import configs
from gpuplane.controller import deviceclass
from gpuplane.controller.claimtemplate import view
from gpuplane.controller.rightsize import alternatives, decide, fleet, need, template
from gpuplane.controller.rightsize.need import Need, NeedError, parse_need
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import discover
from gpuplane.driver.publish.slices import build_pool, render_slices
from testing.driverkit import short_tmpdir
from tests import controllerkit

REPO = Path(__file__).resolve().parents[4]
GIB = 2**30


def _slices(profile: str, **overrides: Any) -> list[dict[str, Any]]:
    root = short_tmpdir("rs")
    sim = Simulator(SimConfig(profile=profile, state_dir=root, node_name=f"n-{profile}", durable=False, **overrides))
    sim.init()
    try:
        return render_slices(build_pool(discover(f"n-{profile}", sim)), 1)
    finally:
        sim.shutdown()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet_slices() -> list[dict[str, Any]]:
    # The A100s have MIG mode on (turning it on or off needs a reset): published as MIG devices only.
    a100 = _slices("a100-40gb", initial_mig_mode={i: True for i in range(8)})
    return [s for p in ("hgx-h100", "gb200-nvl72", "pcie-l4") for s in _slices(p)] + a100


@pytest.fixture(scope="module")
def classes() -> dict[str, deviceclass.ClassView]:
    return controllerkit.shipped_classes(("*.yaml",))


@pytest.fixture(scope="module")
def models(fleet_slices: list[dict[str, Any]]) -> dict[str, fleet.GpuModel]:
    return {m.product: m for m in fleet.models(fleet_slices)}


def by_model(models: dict[str, fleet.GpuModel], word: str) -> fleet.GpuModel:
    (m,) = [m for p, m in models.items() if word in p]
    return m


# --- need -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"compute": 10}, "spec.memory: required"),
        ({"memory": "12Gi"}, "spec.compute: required"),
        ({"memory": "12Gi", "compute": 150}, "150 is outside 1..100"),
        ({"memory": "12Gi", "compute": 0}, "0 is outside 1..100"),
        ({"memory": "12Gi", "compute": True}, "whole percentage"),
        ({"memory": "lots", "compute": 10}, "'lots' is not a quantity"),
        ({"memory": "0", "compute": 10}, "more than zero"),
        ({"memory": "2Pi", "compute": 10}, "more than 1Pi"),
        ({"memory": "1Gi", "compute": 10, "isolation": "medium"}, "'hard' (MIG or a whole GPU) or 'soft'"),
        ({"memory": "1Gi", "compute": 10, "tier": "Gold!"}, "spec.tier"),
        ({"memory": "1Gi", "compute": 10, "gpus": 2}, "unknown field(s) ['gpus']"),
    ],
)
def test_bad_needs_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(NeedError) as err:
        parse_need(spec)
    assert message in str(err.value)


def test_need_defaults_to_hard_isolation() -> None:
    assert parse_need({"memory": "12Gi", "compute": 20}) == Need(12 * GIB, 20, "hard", None)


# --- fleet ------------------------------------------------------------------------------------


def test_fleet_models_come_from_the_published_devices(models: dict[str, fleet.GpuModel]) -> None:
    h100 = by_model(models, "H100")
    assert h100.multiprocessors == 132
    assert [o.profile for o in h100.mig] == sorted(o.profile for o in h100.mig)
    assert {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"} <= {o.profile for o in h100.mig}
    l4 = by_model(models, "L4")
    assert l4.mig == ()  # not MIG-capable: whole GPUs only


def test_tier_limits_come_from_the_device_classes(classes: dict[str, dict[str, Any]]) -> None:
    t = fleet.tiers(classes)
    assert sorted(t) == ["bronze", "gold", "silver"]
    assert (t["bronze"].thread_percent, t["bronze"].memory_bytes) == (20, 16 * GIB)
    assert (t["gold"].thread_percent, t["gold"].memory_bytes) == (60, 48 * GIB)


def test_malformed_devices_are_skipped_not_fatal() -> None:
    bad = {
        "spec": {
            "driver": "gpu.gpuplane.dev",
            "devices": [
                {"name": "x", "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "lots"}}},
                {"name": "y"},
                "not a device",
            ],
        }
    }
    assert fleet.models([bad]) == ()


# --- alternatives -----------------------------------------------------------------------------


def describe(p: alternatives.Plan) -> list[str]:
    return [f"{a.kind}:{a.profile or a.share_percent or ''}@{a.model or ''}" for a in p.alternatives]


def test_hard_need_gets_the_smallest_fitting_profile_of_each_model(
    models: dict[str, fleet.GpuModel], classes: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    # 12Gi and 20 % of the SMs. H100 (132 SMs, 79.6Gi): 1g.20gb has the memory but 16 SMs = 12 %;
    # 2g.20gb has 32 SMs = 24 % -> 2g.20gb. A100-40GB (MIG on, shares of its 7g.40gb's 98 SMs):
    # 2g.10gb has 10Gi < 12Gi; 3g.20gb (42 SMs = 43 %) -> 3g.20gb. L4: no MIG, whole GPU only.
    need = Need(12 * GIB, 20, "hard")
    p = alternatives.plan(need, list(models.values()), fleet.tiers(classes))
    with capsys.disabled():
        print("\n[rightsize] 12Gi/20%/hard ->", *[a.describe() for a in p.alternatives], sep="\n    ")
    chosen = {a.model: a.profile for a in p.alternatives if a.kind == "MIG"}
    assert chosen[by_model(models, "H100").product] == "2g.20gb"
    assert chosen[by_model(models, "A100").product] == "3g.20gb"
    assert not any(a.kind == "MPS" for a in p.alternatives)
    assert p.alternatives[-1].kind == "GPU"
    held = [a.held for a in p.alternatives]
    assert held == sorted(held)


def test_soft_need_puts_an_mps_share_before_a_rounded_up_profile(
    models: dict[str, fleet.GpuModel], classes: dict[str, dict[str, Any]]
) -> None:
    # 12Gi/20 % soft, tier bronze (caps 20 % and 16Gi): an MPS share holds max(20 %, 12Gi/smallest GPU).
    # The smallest GPU with >= 12Gi is the L4 (22Gi): 12/22 = 54 %, more than H100's 2g.20gb (25 %):
    # the MIG profiles come first, then MPS, then the whole GPU.
    p = alternatives.plan(Need(12 * GIB, 20, "soft", "bronze"), list(models.values()), fleet.tiers(classes))
    kinds = [a.kind for a in p.alternatives]
    assert kinds.index("MPS") > 0 and kinds[-1] == "GPU"
    mps = next(a for a in p.alternatives if a.kind == "MPS")
    assert mps.device_class == "mps-bronze.gpu.gpuplane.dev" and mps.share_percent == 20
    # On an H100-only fleet the share (20 % vs 2g.20gb's 25 %) comes first.
    h100 = [by_model(models, "H100")]
    p2 = alternatives.plan(Need(12 * GIB, 20, "soft", "bronze"), h100, fleet.tiers(classes))
    assert [a.kind for a in p2.alternatives] == ["MPS", "MIG", "GPU"]


def test_exact_mig_fit_beats_mps_on_a_tie(models: dict[str, fleet.GpuModel]) -> None:
    h100 = by_model(models, "H100")
    one_g = next(o for o in h100.mig if o.profile == "1g.10gb")
    share = -(-one_g.multiprocessors * 100 // h100.multiprocessors)  # 16/132 -> 13 %
    p = alternatives.plan(Need(one_g.memory_bytes, share - 1, "soft"), [h100], {})
    assert [a.kind for a in p.alternatives][:2] in (["MIG", "MPS"], ["MPS", "MIG"])
    mig, mps = (next(a for a in p.alternatives if a.kind == k) for k in ("MIG", "MPS"))
    assert mig.profile == "1g.10gb"
    assert (p.alternatives[0].kind == "MIG") == (mig.held <= mps.held)


def test_tier_quota_caps_the_mps_alternative(
    models: dict[str, fleet.GpuModel], classes: dict[str, dict[str, Any]]
) -> None:
    p = alternatives.plan(Need(8 * GIB, 30, "soft", "bronze"), list(models.values()), fleet.tiers(classes))
    assert not any(a.kind == "MPS" for a in p.alternatives)
    assert any("tier bronze caps MPS clients at 20% of the SMs, the need is 30%" in n for n in p.notes)
    p = alternatives.plan(Need(20 * GIB, 10, "soft", "bronze"), list(models.values()), fleet.tiers(classes))
    assert any("caps pinned memory at 16Gi" in n for n in p.notes)


def test_memory_larger_than_every_gpu_is_an_error(models: dict[str, fleet.GpuModel]) -> None:
    with pytest.raises(NeedError) as err:
        alternatives.plan(Need(500 * GIB, 10, "hard"), list(models.values()), {})
    assert "500Gi is more than any GPU in the cluster has" in str(err.value)
    assert "GB200" in str(err.value)


def test_unknown_tier_is_an_error(models: dict[str, fleet.GpuModel], classes: dict[str, dict[str, Any]]) -> None:
    with pytest.raises(NeedError) as err:
        alternatives.plan(Need(GIB, 10, "soft", "platinum"), list(models.values()), fleet.tiers(classes))
    assert "no DeviceClass mps-platinum.gpu.gpuplane.dev" in str(err.value) and "bronze, gold, silver" in str(err.value)


def test_at_most_eight_alternatives() -> None:
    many = [
        fleet.GpuModel(f"Model {i}", 80 * GIB, 100, (fleet.MigOption("1g.10gb", 10 * GIB + i, 15 + i),))
        for i in range(10)
    ]
    p = alternatives.plan(Need(GIB, 10, "soft"), many, {})
    assert len(p.alternatives) == 8 and p.alternatives[-1].kind == "GPU"
    assert any("left out (DRA allows 8 alternatives)" in n for n in p.notes)


def test_hostile_product_names_are_escaped_in_cel() -> None:
    assert alternatives.cel_string('a"b\\c') == '"a\\"b\\\\c"'
    with pytest.raises(NeedError):
        alternatives.cel_string("bad\nname")


# --- template and decide ----------------------------------------------------------------------


def request(spec: dict[str, Any], status: dict[str, Any] | None = None) -> need.RequestView:
    """A GpuRequest as the handler reads it."""
    return need.request_view(
        {
            "apiVersion": "gpuplane.dev/v1alpha1",
            "kind": "GpuRequest",
            "metadata": {"name": "infer", "namespace": "team", "uid": "u-1", "generation": 1},
            "spec": spec,
            "status": status or {},
        }
    )


def test_template_has_first_available_and_config_for_the_mps_subrequest(
    fleet_slices: list[dict[str, Any]], classes: dict[str, deviceclass.ClassView]
) -> None:
    out = decide.decide(
        request({"memory": "12Gi", "compute": 20, "isolation": "soft", "tier": "bronze"}), None, fleet_slices, classes
    )
    assert out.create is not None and out.delete is None and out.status is not None
    spec = out.create["spec"]["spec"]["devices"]
    subs = spec["requests"][0]["firstAvailable"]
    assert spec["requests"][0]["name"] == "gpu" and 3 <= len(subs) <= 8
    mps = next(s for s in subs if s["name"] == "mps")
    assert mps["capacity"]["requests"] == {"sharePercent": "20", "memory": str(12 * GIB)}
    (cfg,) = spec["config"]
    assert cfg["requests"] == ["gpu/mps"]
    # The driver's own parser accepts it, and the tier allows it.
    parsed = configs.merge_configs(
        [
            configs.SourcedConfig("FromClass", (), classes["mps-bronze.gpu.gpuplane.dev"].configs[0]),
            configs.SourcedConfig("FromClaim", ("gpu/mps",), cfg["opaque"]["parameters"]),
        ],
        "gpu/mps",
        "gpu",
    )
    assert parsed.sharing.mps is not None and parsed.sharing.mps.defaultActiveThreadPercentage == 20
    assert out.create["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert out.status["phase"] == "Ready" and out.status["claimTemplate"] == "infer"
    assert out.event is not None and out.event[1] == decide.REASON_READY


def test_decide_writes_nothing_when_template_and_status_are_current(
    fleet_slices: list[dict[str, Any]], classes: dict[str, deviceclass.ClassView]
) -> None:
    spec = {"memory": "12Gi", "compute": 20}
    first = decide.decide(request(spec), None, fleet_slices, classes)
    assert first.create is not None and first.status is not None
    again = decide.decide(request(spec, first.status), view(first.create), fleet_slices, classes)
    assert again == decide.Outcome(None)
    # A changed need replaces the (immutable) template.
    changed = decide.decide(
        request({"memory": "30Gi", "compute": 20}, first.status), view(first.create), fleet_slices, classes
    )
    assert changed.delete == "infer" and changed.create is not None
    assert changed.create["metadata"]["annotations"] != first.create["metadata"]["annotations"]


def test_invalid_need_deletes_our_template_and_says_why(
    fleet_slices: list[dict[str, Any]], classes: dict[str, deviceclass.ClassView]
) -> None:
    ok = decide.decide(request({"memory": "12Gi", "compute": 20}), None, fleet_slices, classes)
    assert ok.create is not None
    bad = decide.decide(request({"memory": "500Gi", "compute": 20}, ok.status), view(ok.create), fleet_slices, classes)
    assert bad.delete == "infer" and bad.create is None
    assert bad.status is not None and bad.status["phase"] == "Invalid"
    assert bad.event is not None and bad.event[:2] == ("Warning", decide.REASON_INVALID)
    assert "500Gi is more than any GPU" in bad.event[2]


def test_a_template_we_do_not_own_is_left_alone(
    fleet_slices: list[dict[str, Any]], classes: dict[str, deviceclass.ClassView]
) -> None:
    foreign = {"metadata": {"name": "infer", "ownerReferences": []}, "spec": {}}
    out = decide.decide(request({"memory": "12Gi", "compute": 20}), view(foreign), fleet_slices, classes)
    assert out.delete is None and out.create is None
    assert out.status is not None and "does not own it" in out.status["message"]


def test_no_gpus_yet_is_pending_and_keeps_the_template(classes: dict[str, dict[str, Any]]) -> None:
    ours = {
        "metadata": {"name": "infer", "ownerReferences": [{"kind": "GpuRequest", "uid": "u-1", "controller": True}]}
    }
    out = decide.decide(request({"memory": "12Gi", "compute": 20}), view(ours), [], classes)
    assert out.delete is None and out.status is not None and out.status["phase"] == "Pending"


def test_template_owned_by_checks_the_uid() -> None:
    t = {"metadata": {"ownerReferences": [{"kind": "GpuRequest", "uid": "other", "controller": True}]}}
    assert not template.owned_by(view(t), request({}))
    mine = {"kind": "GpuRequest", "uid": "u-1", "controller": True}
    assert template.owned_by(view({"metadata": {"ownerReferences": [mine]}}), request({}))
    assert not template.owned_by(view({"metadata": {"ownerReferences": [{**mine, "controller": "yes"}]}}), request({}))


def test_a_gpu_request_is_read_once_and_total_on_any_body() -> None:
    got = request({"memory": "12Gi"}, {"phase": "Ready"})
    assert (got.key, got.uid, got.generation, got.spec, dict(got.status)) == (
        "team/infer",
        "u-1",
        1,
        {"memory": "12Gi"},
        {"phase": "Ready"},
    )
    for odd in ({}, {"metadata": "x", "status": []}, {"metadata": {"name": 3, "generation": True}, "status": None}):
        v = need.request_view(odd)
        assert (v.key, v.uid, v.generation, dict(v.status)) == ("/", "", None, {})
        with pytest.raises(NeedError):
            parse_need(v.spec)  # an absent spec is a clear error, not a crash
