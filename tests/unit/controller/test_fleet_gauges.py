"""The controller's fleet gauges (``gpuplane.controller.fleet_gauges``): the numbers the operator's alerts read.

The fleet is ``tests.controllerkit.cluster_slices``, as the real driver publishes it: two HGX H100
nodes of 8 GPUs (each its own NVLink domain) and four GB200 trays of 4 GPUs in one NVL72 clique.
Claims are kept as the controller's claim index keeps them (``indexed.claim``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import pytest

from gpuplane.api import kubetime
from gpuplane.controller import config, fleet_gauges, indexed, metrics, runtime
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.gang import world
from gpuplane.driver.inventory import mig_device_name
from tests import controllerkit as kit

H100, GB200 = "NVIDIA H100 80GB HBM3", "NVIDIA GB200"
NOW = kit.T0 + 3600


@pytest.fixture(scope="module", name="fleet")
def fleet_fixture(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return kit.cluster_slices(Path(tmp_path_factory.mktemp("fleet")))


def claim(
    name: str,
    *,
    created: float = kit.T0,
    cls: str = "gpu.gpuplane.dev",
    held: tuple[tuple[str, str], ...] = (),
    deleting: bool = False,
) -> indexed.ClaimView:
    """A claim as the index keeps it; ``held``: (node, device) of its allocation (none: pending)."""
    body = kit.claim_body([kit.req("gpus", cls=cls)])
    body["metadata"].update(name=name, uid=f"uid-{name}", creationTimestamp=kubetime.rfc3339(created))
    if deleting:
        body["metadata"]["deletionTimestamp"] = kubetime.rfc3339(created + 1)
    if held:
        results = [{"driver": "gpu.gpuplane.dev", "pool": n, "device": d, "request": "gpus"} for n, d in held]
        body["status"] = {"allocation": {"devices": {"results": results}}}
    return indexed.claim(body)


def figures(fleet: list[dict[str, Any]], *claims: indexed.ClaimView) -> dict[str, fleet_gauges.Free]:
    return fleet_gauges.free_by_product(world.cluster_view(kit.make_world(fleet, [], claims_=claims)))


def test_an_empty_fleet_offers_a_node_of_h100s_and_the_whole_clique_of_gb200s(fleet: list[dict[str, Any]]) -> None:
    assert figures(fleet) == {
        H100: fleet_gauges.Free(largest_block=8, gpus=16),  # one HGX node: its own NVLink domain
        GB200: fleet_gauges.Free(largest_block=16, gpus=16),  # four empty trays of one clique: a TP16 group
    }


def test_held_gpus_shrink_the_largest_block_and_the_free_count(fleet: list[dict[str, Any]]) -> None:
    one_each = (
        claim("a", held=(("hgx-0", "gpu-0"),)),
        claim("b", held=(("hgx-1", "gpu-3"),)),
        claim("c", held=(("nvl-0", "gpu-0"),)),
    )
    assert figures(fleet, *one_each) == {
        H100: fleet_gauges.Free(largest_block=7, gpus=14),
        GB200: fleet_gauges.Free(largest_block=12, gpus=15),  # three empty trays of four; the fourth has 3
    }
    # A MIG instance makes its GPU partly used: no longer a free whole GPU.
    mig = claim("m", cls="mig.gpuplane.dev", held=(("hgx-0", mig_device_name(5, "1g.10gb", 0)),))
    assert figures(fleet, *one_each, mig)[H100] == fleet_gauges.Free(largest_block=7, gpus=13)
    full_tray = tuple(claim(f"t{k}", held=(("nvl-1", f"gpu-{k}"),)) for k in range(4))
    assert figures(fleet, *one_each, *full_tray)[GB200] == fleet_gauges.Free(largest_block=8, gpus=11)


def test_pending_counts_only_our_unallocated_claims_a_pod_waits_for() -> None:
    claims = [
        claim("old", created=kit.T0),
        claim("new", created=NOW - 30),
        claim("nobody-uses-it", created=kit.T0 - 500),  # no pod names it: DRA has not tried to allocate it
        claim("going", created=kit.T0 - 500, deleting=True),
        claim("theirs", created=kit.T0 - 500, cls="other.example.com"),
        claim("done", created=kit.T0 - 500, held=(("hgx-0", "gpu-0"),)),
    ]
    waited = {f"ns/{n}" for n in ("old", "new", "going", "theirs", "done")}
    got = fleet_gauges.pending_claims(claims, kit.CLASSES, waited, NOW)
    assert got == fleet_gauges.Pending(count=2, oldest_s=3600.0)
    assert fleet_gauges.pending_claims(claims[2:], kit.CLASSES, waited, NOW) == fleet_gauges.Pending(0, 0.0)


def _value(meter: metrics.ControllerMetrics, name: str, **labels: str) -> float | None:
    return meter.registry.get_sample_value(name, labels)


def test_the_exporter_sets_the_gauges_and_drops_a_product_that_left() -> None:
    meter = metrics.ControllerMetrics()
    exporter = fleet_gauges.Exporter(meter)
    exporter.pending(fleet_gauges.Pending(count=3, oldest_s=725.5))
    exporter.free({H100: fleet_gauges.Free(7, 14), GB200: fleet_gauges.Free(12, 15)})
    assert _value(meter, "gpuplane_claims_pending") == 3
    assert _value(meter, "gpuplane_claim_pending_oldest_seconds") == 725.5
    assert _value(meter, "gpuplane_fleet_largest_free_block_gpus", product=H100) == 7
    assert _value(meter, "gpuplane_fleet_free_gpus", product=GB200) == 15
    exporter.free({H100: fleet_gauges.Free(8, 16)})
    assert _value(meter, "gpuplane_fleet_largest_free_block_gpus", product=H100) == 8
    assert _value(meter, "gpuplane_fleet_largest_free_block_gpus", product=GB200) is None
    assert _value(meter, "gpuplane_fleet_free_gpus", product=GB200) is None


def _runtime() -> runtime.Runtime:
    cfg = config.parse_args(["--identity", "a"], {})
    return runtime.Runtime.create(cfg, cast(Any, None), metrics.ControllerMetrics())  # no writer: it writes nothing


def test_one_pass_reads_the_world_and_reuses_an_unchanged_plans_view(fleet: list[dict[str, Any]]) -> None:
    rt = _runtime()
    pending = claim("p", created=time.time() - 90)  # one_pass reads the clock
    w = kit.make_world(fleet, [], claims_=[pending, claim("a", held=(("hgx-0", "gpu-0"),))])
    exporter = fleet_gauges.Exporter(rt.metrics)
    asyncio.run(fleet_gauges.one_pass(rt, exporter, lambda: w, {"ns/p"}))
    assert _value(rt.metrics, "gpuplane_claims_pending") == 1
    assert 90 <= (_value(rt.metrics, "gpuplane_claim_pending_oldest_seconds") or 0) < 120
    assert _value(rt.metrics, "gpuplane_fleet_largest_free_block_gpus", product=H100) == 8
    assert _value(rt.metrics, "gpuplane_fleet_free_gpus", product=H100) == 15
    # The last queue plan's view, built at the current index version, is used as it is (no second build).
    both = (claim("a", held=(("hgx-0", "gpu-0"),)), claim("b", held=(("hgx-1", "gpu-0"),)))
    busier = world.cluster_view(kit.make_world(fleet, [], claims_=both))
    rt.state(gang_run.GangState).plan = (rt.shared.version, cast(Any, None), busier)
    asyncio.run(fleet_gauges.one_pass(rt, exporter, lambda: w, set()))
    assert _value(rt.metrics, "gpuplane_claims_pending") == 0
    assert _value(rt.metrics, "gpuplane_fleet_free_gpus", product=H100) == 14
    assert _value(rt.metrics, "gpuplane_fleet_largest_free_block_gpus", product=H100) == 7
    assert fleet_gauges.current_view(rt) is busier
    rt.shared.version += 1  # something indexed changed: that view is stale
    assert fleet_gauges.current_view(rt) is None


def test_the_interval_is_a_flag_with_an_environment_fallback() -> None:
    assert config.parse_args(["--identity", "a"], {}).fleet_gauges_interval_s == 30.0
    assert config.parse_args(["--identity", "a"], {"GPUPLANE_FLEET_GAUGES_INTERVAL": "7"}).fleet_gauges_interval_s == 7
    assert config.parse_args(["--identity", "a", "--fleet-gauges-interval", "2.5"], {}).fleet_gauges_interval_s == 2.5
