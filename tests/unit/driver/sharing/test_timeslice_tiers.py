"""Tiers on a time-sliced GPU, through the driver's prepare path on the simulator.

The GPU is set to the interval of the highest tier time-slicing it; a tier joins a GPU another
tier time-slices only when the higher tier's class allows it; a claim may lengthen its class's
interval (a lower tier), never shorten it, and cannot give consent its class did not.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.api import configs
from gpuplane.controller.claim import checks
from gpuplane.driver.sharing import timeslice_tiers
from testing.driverkit import driver_env, make_claim, ref
from tests.controllerkit import CLASSES, claim_body, req

CFG = {"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "GpuConfig"}


def tier(interval: str, share_lower: bool = False) -> dict[str, Any]:
    ts: dict[str, Any] = {"interval": interval}
    if share_lower:
        ts["shareWithLowerTiers"] = True
    return {**CFG, "sharing": {"strategy": "TimeSlicing", "timeSlicing": ts}}


def test_the_gpu_gets_the_highest_tier_interval_and_falls_back_when_it_leaves() -> None:
    with driver_env("hgx-h100", "node-a") as drv:
        uuid = drv.sim.uuid_of_minor(0)
        gold = make_claim("gold", drv.node, [{"device": "gpu-0", "shareID": "1"}], class_config=[tier("Short", True)])
        bronze = make_claim("bronze", drv.node, [{"device": "gpu-0", "shareID": "2"}], class_config=[tier("Long")])
        drv.claims.add(gold, bronze)
        assert drv.state.prepare([ref(bronze)])[bronze["metadata"]["uid"]].error == ""
        assert drv.sim.timeslice(uuid) == "Long"
        assert drv.state.prepare([ref(gold)])[gold["metadata"]["uid"]].error == ""  # gold's class consents
        assert drv.sim.timeslice(uuid) == "Short", "the GPU takes the gold tier's interval"
        drv.state.unprepare([ref(gold)])
        assert drv.sim.timeslice(uuid) == "Long", "back to the bronze tier's once gold leaves"
        drv.state.unprepare([ref(bronze)])
        assert drv.sim.timeslice(uuid) == "Default"


def test_gold_never_lands_with_bronze_unless_its_class_allows_it() -> None:
    with driver_env("hgx-h100", "node-a") as drv:
        uuid = drv.sim.uuid_of_minor(1)
        bronze = make_claim("bronze", drv.node, [{"device": "gpu-1", "shareID": "1"}], class_config=[tier("Long")])
        gold = make_claim("gold", drv.node, [{"device": "gpu-1", "shareID": "2"}], class_config=[tier("Short")])
        drv.claims.add(bronze, gold)
        assert drv.state.prepare([ref(bronze)])[bronze["metadata"]["uid"]].error == ""
        err = drv.state.prepare([ref(gold)])[gold["metadata"]["uid"]].error
        assert "tier bronze (interval Long)" in err and "this claim is tier gold (interval Short)" in err
        assert "shareWithLowerTiers" in err
        assert drv.sim.timeslice(uuid) == "Long", "the refused claim changed nothing"
        assert gold["metadata"]["uid"] not in drv.state.snapshot().claims


def test_a_claim_may_lengthen_its_interval_but_not_shorten_it_or_consent() -> None:
    def merged(claim: dict[str, Any], cls: dict[str, Any]) -> configs.DeviceConfig:
        return configs.merge_configs(
            [configs.SourcedConfig("FromClass", (), cls), configs.SourcedConfig("FromClaim", (), claim)], "gpu", "gpu"
        )

    lengthened = merged(tier("Long"), tier("Short"))
    assert lengthened.sharing.timeSlicing is not None and lengthened.sharing.timeSlicing.interval == "Long"
    with pytest.raises(configs.ConfigError, match="Short is a higher tier than the device class's Long"):
        merged(tier("Short"), tier("Long"))
    with pytest.raises(configs.ConfigError, match="shareWithLowerTiers is the device class's choice"):
        merged(tier("Long", True), tier("Long"))


OWN_CONSENT = "timeSlicing.shareWithLowerTiers is the device class's choice, never a claim's; remove it"


def test_a_claim_on_the_plain_class_cannot_consent_for_itself() -> None:
    """Issue 15 audit D1: on gpu.gpuplane.dev (no class config) a claim gave itself Short (gold) and consent."""

    def merged(*entries: configs.SourcedConfig) -> configs.DeviceConfig:
        return configs.merge_configs(list(entries), "gpu", "gpu")

    with pytest.raises(configs.ConfigError, match=OWN_CONSENT) as refused:
        merged(configs.SourcedConfig("FromClaim", (), tier("Short", True)))
    assert str(refused.value).startswith("claim config for request 'gpu': "), refused.value
    assert "use a DeviceClass that sets it" in str(refused.value)
    # Under a class that consents the claim still may not say it itself (the class's word is enough) ...
    with pytest.raises(configs.ConfigError, match=OWN_CONSENT):
        merged(
            configs.SourcedConfig("FromClass", (), tier("Short", True)),
            configs.SourcedConfig("FromClaim", (), tier("Short", True)),
        )
    # ... and a claim that leaves it out keeps the class's consent.
    consenting = configs.SourcedConfig("FromClass", (), tier("Short", True))
    kept = merged(consenting, configs.SourcedConfig("FromClaim", (), tier("Long"))).sharing.timeSlicing
    assert kept is not None and (kept.interval, kept.shareWithLowerTiers) == ("Long", True)
    # An interval alone on the plain class is the claim's choice of tier, as picking timeslice-gold would be.
    plain = merged(configs.SourcedConfig("FromClaim", (), tier("Short"))).sharing.timeSlicing
    assert plain is not None and (plain.interval, plain.shareWithLowerTiers) == ("Short", False)
    explicit_no = {**CFG, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"shareWithLowerTiers": False}}}
    assert merged(configs.SourcedConfig("FromClaim", (), explicit_no)).sharing.strategy == "TimeSlicing"
    # The class's own config may set it (parse_config is the context-free check of any config).
    assert configs.parse_config(tier("Short", True)).sharing.timeSlicing == configs.TimeSlicingConfig(
        interval="Short", shareWithLowerTiers=True
    )
    with pytest.raises(configs.ConfigError, match=OWN_CONSENT):
        configs.parse_claim_config(tier("Short", True))


def test_the_controller_refuses_a_claims_own_consent_as_the_claim_appears() -> None:
    opaque = [{"opaque": {"driver": "gpu.gpuplane.dev", "parameters": tier("Short", True)}}]
    (problem,) = checks.validate(claim_body([req("g")], opaque), CLASSES)
    assert OWN_CONSENT in problem and "request 'g'" in problem, problem
    # Configs on a claim with no class of ours are still parsed, as a claim's.
    (problem,) = checks.validate(claim_body([req("g", cls="other.example.com")], opaque), CLASSES)
    assert OWN_CONSENT in problem, problem


def test_the_driver_refuses_a_claims_own_consent_and_changes_nothing() -> None:
    with driver_env("hgx-h100", "node-a") as drv:
        uuid = drv.sim.uuid_of_minor(2)
        share = [{"device": "gpu-2", "shareID": "1"}]
        selfmade = make_claim("selfmade", drv.node, share, claim_config=[tier("Short", True)])
        drv.claims.add(selfmade)
        err = drv.state.prepare([ref(selfmade)])[selfmade["metadata"]["uid"]].error
        assert OWN_CONSENT in err, err
        assert drv.sim.timeslice(uuid) == "Default", "the refused claim changed the GPU's time-slice"
        assert selfmade["metadata"]["uid"] not in drv.state.snapshot().claims


def test_interval_rule_is_pure_and_total() -> None:
    assert timeslice_tiers.gpu_interval([]) == "Default"
    assert timeslice_tiers.gpu_interval(["Long", None, "Medium"]) == "Medium"
    assert timeslice_tiers.mix_refusal(("Short", False), ("Short", False), "x", "gpu-0") is None
    assert timeslice_tiers.mix_refusal(("Long", False), ("Short", True), "x", "gpu-0") is None
    assert timeslice_tiers.mix_refusal(("Long", False), ("Short", False), "x", "gpu-0") is not None
