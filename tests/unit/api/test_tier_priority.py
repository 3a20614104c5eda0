"""MPS client priority per tier: the tier classes set it, a claim may lower it, never raise it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplane.api import configs

REPO = Path(__file__).resolve().parents[3]


def class_params(tier: str) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "manifests" / "deviceclasses" / f"mps-{tier}.yaml").read_text())
    params: dict[str, Any] = body["spec"]["config"][0]["opaque"]["parameters"]
    return params


def claim_params(priority: str | None) -> dict[str, Any]:
    mps: dict[str, Any] = {} if priority is None else {"clientPriority": priority}
    return {"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": mps}}


def merged(tier: str, claim_priority: str | None) -> configs.DeviceConfig:
    entries = [configs.SourcedConfig("FromClass", (), class_params(tier))]
    if claim_priority is not None:
        entries.append(configs.SourcedConfig("FromClaim", (), claim_params(claim_priority)))
    return configs.merge_configs(entries, "gpu", "gpu")


@pytest.mark.parametrize(("tier", "value"), [("gold", 0), ("silver", 0), ("bronze", 1)])
def test_each_tier_class_sets_its_priority(tier: str, value: int) -> None:
    mps = merged(tier, None).sharing.mps
    assert mps is not None and mps.client_priority_value() == value


def test_a_claim_may_lower_its_priority() -> None:
    mps = merged("gold", "BelowNormal").sharing.mps
    assert mps is not None and mps.clientPriority == "BelowNormal" and mps.client_priority_value() == 1


def test_a_claim_may_not_raise_it_above_its_tier() -> None:
    with pytest.raises(configs.ConfigError) as err:
        merged("bronze", "Normal")
    assert "mps.clientPriority Normal is above the device class's BelowNormal" in str(err.value)
    assert "never raise it above its tier" in str(err.value)


def test_only_the_documented_values_are_accepted() -> None:
    with pytest.raises(configs.ConfigError) as err:
        configs.parse_config(claim_params("High"))
    assert "clientPriority" in str(err.value) and "'Normal'" in str(err.value)
