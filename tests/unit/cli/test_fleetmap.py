"""``kubectl gpuplane map``'s model and drawing (gpuplane.cli.fleetmap), on slices the driver's own code publishes.

The node's slices come from the simulator through the driver's discovery and slice builder (as
published); the claims are written as the API serves allocated claims. Checked: MIG instances drawn on
the memory slices they take, a whole GPU held, MPS shares with tier and the share left, a taint, the
largest free block, whole-GPU-only slices, colour only when asked, what RBAC hid, and hostile objects
skipped rather than crashing the plugin.
"""

from __future__ import annotations

import copy
import shutil
from typing import Any

import pytest

from gpuplane.cli import fleetmap, kubectl_gpuplane
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import discover
from gpuplane.driver.publish.slices import build_pool, render_slices
from testing.driverkit import short_tmpdir

NODE = "hgx-0"


def _slices(mig_placements: bool = True) -> list[dict[str, Any]]:
    root = short_tmpdir("fm")
    sim = Simulator(SimConfig(profile="hgx-h100", state_dir=root, node_name=NODE, durable=False))
    sim.init()
    try:
        inventory = discover(NODE, sim, mig_placements=mig_placements)
        return render_slices(build_pool(inventory), 1)
    finally:
        sim.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def claim(ns: str, name: str, device: str, cls: str = "mig.gpuplane.dev", share: int | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": 1}
    result: dict[str, Any] = {"request": "gpu", "driver": "gpu.gpuplane.dev", "pool": NODE, "device": device}
    if share is not None:
        exactly["capacity"] = {"requests": {"sharePercent": str(share)}}
        result["consumedCapacity"] = {"sharePercent": str(share)}
        result["shareID"] = f"{name}-share"
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


CLAIMS = [
    claim("team-a", "big", "gpu-0-mig-3g-40gb-0"),
    claim("team-b", "small", "gpu-0-mig-2g-20gb-4"),
    claim("team-c", "train", "gpu-1", cls="gpu.gpuplane.dev"),
    claim("serve", "gold", "gpu-2", cls="mps-gold.gpu.gpuplane.dev", share=60),
    claim("batch", "bronze", "gpu-2", cls="mps-bronze.gpu.gpuplane.dev", share=20),
]


@pytest.fixture(scope="module")
def slices() -> list[dict[str, Any]]:
    out = _slices()
    for s in out:  # an Xid taint on gpu-3, as the driver's health watcher publishes it
        for d in s["spec"].get("devices") or []:
            if d["name"] == "gpu-3":
                d["taints"] = [{"key": "gpu.gpuplane.dev/xid", "value": "79", "effect": "NoSchedule"}]
    return out


def _line(lines: list[str], device: str) -> str:
    return next(line for line in lines if line.strip().startswith(device + " "))


def test_every_gpu_of_the_node_is_drawn_with_what_holds_it(slices: list[dict[str, Any]]) -> None:
    fleet = fleetmap.build(slices, CLAIMS)
    lines = fleetmap.render(fleet)
    assert lines[0].startswith(f"{NODE}  (8 GPUs; NVLink domain {NODE}.nvl0)")
    gpu0 = _line(lines, "gpu-0")
    assert "[A A A A B B . .]" in gpu0  # 3g.40gb takes 4 memory slices from 0, 2g.20gb 2 from 4
    assert "A=3g.40gb team-a/big (exclusive)" in gpu0 and "B=2g.20gb team-b/small (exclusive)" in gpu0
    assert "largest free: 1g.20gb @6" in gpu0  # H100's 2g.20gb starts at 0, 2 or 4 only
    gpu1 = _line(lines, "gpu-1")
    assert "[A A A A A A A A]" in gpu1 and "A=whole GPU team-c/train (exclusive)" in gpu1 and "full" in gpu1
    gpu2 = _line(lines, "gpu-2")
    assert "[s s s s s s . .]" in gpu2 and "free share 20 %" in gpu2  # shares drawn cumulatively: 60 % -> 5, 80 % -> 6
    assert "serve/gold (MPS gold 60 %)" in gpu2 and "batch/bronze (MPS bronze 20 %)" in gpu2
    gpu3 = _line(lines, "gpu-3")
    assert (
        "[. . . . . . . .]" in gpu3 and "free: whole GPU" in gpu3 and "taint gpu.gpuplane.dev/xid=79:NoSchedule" in gpu3
    )
    assert fleetmap.summary(fleet) == [
        "1 nodes, 8 GPUs: 5 free, 1 held whole, 1 cut by MIG, 1 shared (MPS or time-slice), 1 tainted"
    ]
    assert not any("\x1b[" in line for line in lines)


def test_colour_only_when_asked(slices: list[dict[str, Any]]) -> None:
    lines = fleetmap.render(fleetmap.build(slices, CLAIMS), colour=True)
    assert "\x1b[31mA\x1b[0m" in _line(lines, "gpu-0")


def test_whole_gpu_only_slices_draw_one_block() -> None:
    fleet = fleetmap.build(_slices(mig_placements=False), [claim("team-c", "train", "gpu-5", cls="gpu.gpuplane.dev")])
    lines = fleetmap.render(fleet)
    assert (
        "[A]" in _line(lines, "gpu-5") and "[.]" in _line(lines, "gpu-4") and "free: whole GPU" in _line(lines, "gpu-4")
    )


def test_what_rbac_hid_is_said(slices: list[dict[str, Any]]) -> None:
    fleet = fleetmap.build(slices, CLAIMS[:1])
    fleet.hidden.append("you may not list ResourceClaims in every namespace")
    assert fleetmap.render(fleet)[-1] == "hidden: you may not list ResourceClaims in every namespace"


def test_hostile_objects_are_skipped_not_fatal(slices: list[dict[str, Any]]) -> None:
    junk: list[Any] = [
        {"spec": {"driver": "gpu.gpuplane.dev", "nodeName": NODE, "devices": ["x", {"attributes": "y"}]}},
        {"spec": {"driver": "other.example.com", "nodeName": "n2", "devices": [{"name": "gpu-0"}]}},
        {"spec": {"driver": "gpu.gpuplane.dev", "nodeName": 7}},
    ]
    bad_claims: list[Any] = [
        {"metadata": {}, "status": {"allocation": {"devices": {"results": [{"driver": "gpu.gpuplane.dev"}]}}}},
        claim("team-x", "ghost", "gpu-9-mig-7g-80gb-0"),  # a device no slice has
    ]
    fleet = fleetmap.build([*copy.deepcopy(slices), *junk], [*bad_claims, *CLAIMS])
    assert set(fleet.nodes) == {NODE} and len(fleet.nodes[NODE]) == 8
    assert "team-x/ghost" not in "\n".join(fleetmap.render(fleet))


def test_the_plugin_parses_its_command_line() -> None:
    args = kubectl_gpuplane._parser().parse_args(["--context", "prod", "map", "--node", "a", "--node", "b"])
    assert (args.command, args.node, args.color, args.context) == ("map", ["a", "b"], "auto", "prod")
    with pytest.raises(SystemExit):
        kubectl_gpuplane._parser().parse_args([])
