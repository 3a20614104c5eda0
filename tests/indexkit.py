"""A small fleet of pools the driver itself builds, and the controller's slice index over them.

For the tests that run the controller's readers over the API's objects and over its compact
indexes (tests/unit/controller/test_index_readers.py, tests/unit/controller/steer/test_index_readers_steer.py):
two HGX H100 nodes and one GB200 tray, a health taint on gpu-1 of each, a noisy-neighbour taint on
gpu-7 of both HGX nodes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuplane.api import noisy_taint
from gpuplane.controller.node import slice_index
from gpuplane.driver import inventory
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.publish import slices
from gpuplane.driver.publish.slices import DeviceTaint

T0 = 1_800_000_000.0
HOGS = {"hgx-0": "0b9c3f52-6a1e-4c7d-9e8f-1a2b3c4d5e6f", "hgx-1": "0b9c3f52-6a1e-4c7d-9e8f-1a2b3c4d5e70"}


def ts(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def pool(tmp: Path, node: str, profile: str) -> list[dict[str, Any]]:
    """One node's ResourceSlices as the driver renders them (generation 3)."""
    cfg = SimConfig(profile=profile, state_dir=tmp / node, node_name=node, durable=False)
    (tmp / node).mkdir(parents=True, exist_ok=True)
    with Simulator(cfg) as sim:
        inv = inventory.discover(node, sim)
    taints: dict[str, list[DeviceTaint]] = {"gpu-1": [DeviceTaint("gpu.gpuplane.dev/xid", "xid-94", "NoSchedule")]}
    if node in HOGS:
        value = noisy_taint.encode(noisy_taint.NoisyFigures(HOGS[node], 80, 50, 3))
        taints["gpu-7"] = [DeviceTaint(noisy_taint.KEY, value, noisy_taint.EFFECT, ts(T0))]
    return slices.render_slices(slices.build_pool(inv, taints=taints), 3)


def fleet(tmp: Path) -> list[dict[str, Any]]:
    """hgx-0, hgx-1 (HGX H100) and nvl-0 (GB200) slices."""
    return [*pool(tmp, "hgx-0", "hgx-h100"), *pool(tmp, "hgx-1", "hgx-h100"), *pool(tmp, "nvl-0", "gb200-nvl72")]


def slice_idx(raw: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The slice index as the handlers build it: digests keyed by node, several per node."""
    interner = slice_index.Interner()
    out: dict[str, list[Any]] = {}
    for s in raw:
        d = slice_index.digest(s["metadata"]["name"], s["spec"], interner)
        assert d is not None
        out.setdefault(d.node, []).append(d)
    return out
