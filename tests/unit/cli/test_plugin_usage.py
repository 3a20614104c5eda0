"""``kubectl gpuplane usage`` (gpuplane.cli.usage): per-tenant GPUs held now, by kind and tier, and their cost.

On the driver's own slices of a simulated HGX H100 node (as test_fleetmap builds them), with claims as the
API serves them allocated. Each tenant's figure is checked against docs/cost.md's charging rules by hand:
a whole GPU 1, a MIG device memory slices / 8, an MPS share sharePercent / 100, a time-sliced GPU 1 / N.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuplane.cli import fleetmap, kubectl_gpuplane, usage
from tests.unit.cli.test_fleetmap import CLAIMS, _slices, claim


@pytest.fixture(scope="module")
def slices() -> list[dict[str, Any]]:
    return _slices()


TIME_SLICED = [
    claim("batch", "ts-1", "gpu-5", cls="timeslice-silver.gpu.gpuplane.dev", share=50),
    claim("serve", "ts-2", "gpu-5", cls="timeslice-gold.gpu.gpuplane.dev", share=50),
    claim("team-a", "small", "gpu-6-mig-1g-10gb-0"),
]


def test_each_tenant_is_charged_as_the_cost_ledger_charges(slices: list[dict[str, Any]]) -> None:
    tenants = {t.namespace: t for t in usage.tally(fleetmap.build(slices, CLAIMS + TIME_SLICED))}
    assert set(tenants) == {"team-a", "team-b", "team-c", "serve", "batch"}
    a = tenants["team-a"]  # 3g.40gb (4 of 8 memory slices) + 1g.10gb (1 of 8)
    assert a.by_kind["mig"] == pytest.approx(5 / 8) and a.gpus == pytest.approx(5 / 8)
    assert a.claims == {"team-a/big", "team-a/small"}
    assert tenants["team-b"].by_kind["mig"] == pytest.approx(2 / 8)  # 2g.20gb
    assert tenants["team-c"].by_kind["whole"] == 1.0
    serve = tenants["serve"]  # MPS gold 60 % of gpu-2, time-slice gold: one of two claims on gpu-5
    assert serve.by_kind["mps"] == pytest.approx(0.6) and serve.by_kind["timeslice"] == pytest.approx(0.5)
    assert serve.by_tier == {"gold": pytest.approx(1.1)}
    batch = tenants["batch"]  # MPS bronze 20 % of gpu-2, time-slice silver: the other of two on gpu-5
    assert batch.gpus == pytest.approx(0.7) and batch.by_tier == {"bronze": 0.2, "silver": 0.5}
    assert [t.namespace for t in usage.tally(fleetmap.build(slices, CLAIMS + TIME_SLICED))] == [
        "serve",
        "team-c",
        "batch",
        "team-a",
        "team-b",
    ]


def test_the_table_and_the_fleet_total_with_a_price(slices: list[dict[str, Any]]) -> None:
    lines = usage.render(fleetmap.build(slices, CLAIMS), price_per_gpu_hour=2.5)
    assert lines[0].split() == [
        "NAMESPACE",
        "CLAIMS",
        "GPUS",
        "WHOLE",
        "MIG",
        "MPS",
        "TIMESLICE",
        "SHARED",
        "BY",
        "TIER",
        "COST/HOUR",
    ]
    team_c = next(line for line in lines if line.startswith("team-c "))
    assert team_c.split() == ["team-c", "1", "1", "1", "0", "0", "0", "0", "-", "2.50"]
    serve = next(line for line in lines if line.startswith("serve "))
    assert serve.split() == ["serve", "1", "0.6", "0", "0", "0.6", "0", "0", "gold", "0.6", "1.50"]
    # held: 1 (team-c) + 0.5 + 0.25 (MIG) + 0.6 + 0.2 (MPS) = 2.55 of 8 GPUs
    assert lines[-1] == "5 namespaces hold 2.55 of 8 GPUs (32 %): 6.38 per hour at 2.5 per GPU-hour"


def test_json_and_what_rbac_hid(slices: list[dict[str, Any]]) -> None:
    fleet = fleetmap.build(slices, CLAIMS[:1])
    fleet.hidden.append("only team-a's allocations")
    out = usage.as_json(fleet, None)
    assert json.loads(json.dumps(out)) == {
        "tenants": [
            {
                "namespace": "team-a",
                "claims": ["team-a/big"],
                "gpus": 0.5,
                "byKind": {"whole": 0.0, "mig": 0.5, "mps": 0.0, "timeslice": 0.0, "shared": 0.0},
                "byTier": {"-": 0.5},
                "nodes": ["hgx-0"],
            }
        ],
        "fleetGpus": 8,
        "hidden": ["only team-a's allocations"],
    }
    assert usage.render(fleet)[-1] == "hidden: only team-a's allocations"
    assert usage.render(fleetmap.build(slices, []))[-1] == "0 namespaces hold 0 of 8 GPUs (0 %)"


@pytest.mark.parametrize("price", ["-1", "nan", "inf"])
def test_a_bad_price_is_refused_before_anything_is_read(price: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl_gpuplane.main(["usage", "--price", price]) == 2
    assert "--price must be a finite number >= 0" in capsys.readouterr().err
