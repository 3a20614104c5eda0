"""The order kube-scheduler's DRA allocator meets a node's devices in, read from the driver's own slices.

The allocator (``allocateOne``) sorts a pool's slices by name and takes devices in slice order;
:func:`published_walk` renders a simulated node's pool with the driver's ``build_pool`` /
``render_slices`` (or a steered layout) and reads that walk back, so the model in
:mod:`bench.kube.kube_model` follows whatever ``gpuplane/driver/publish`` decides.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplane.controller.node import snapshot_builder
from gpuplane.driver import inventory
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.publish import slices


@dataclass(frozen=True)
class WalkOrder:
    """The order the allocator meets one node's devices in (GPU positions are minor numbers)."""

    whole: tuple[int, ...]
    mig: Mapping[str, tuple[tuple[int, int], ...]]  # geometry profile -> (gpu, start) in walk order


Layout = Callable[[inventory.Inventory], slices.PoolContent]


def published_walk(sim_profile: str, builder: Layout | None = None) -> WalkOrder:
    """The walk order of a simulated ``sim_profile`` node's pool as the driver publishes it today.

    ``builder`` (optional) is a function ``Inventory -> PoolContent`` to use instead of
    ``slices.build_pool`` (a steered layout, for tests).
    """
    with (
        tempfile.TemporaryDirectory() as d,
        Simulator(SimConfig(profile=sim_profile, state_dir=Path(d), node_name="n", durable=False)) as sim,
    ):
        inv = inventory.discover("n", sim)
    pool = slices.build_pool(inv) if builder is None else builder(inv)
    objs = sorted(slices.render_slices(pool, 1), key=lambda o: o["metadata"]["name"])
    return walk_of(objs)


def walk_of(objs: Sequence[Mapping[str, Any]], pool: str = "n") -> WalkOrder:
    """The allocator's walk over one pool's slices (pool ``pool``): slices by name, devices in order."""
    view = snapshot_builder.build_view(objs)
    ordered = sorted(objs, key=lambda o: str(o["metadata"]["name"]))
    whole: list[int] = []
    mig: dict[str, list[tuple[int, int]]] = {}
    for obj in ordered:
        for dev in obj["spec"].get("devices") or []:
            key = f"{pool}/{dev['name']}"
            gpu = view.by_id.get(key)
            if gpu is not None:
                whole.append(int(gpu.device.split("-")[1]))
                continue
            info = view.mig.get(key)
            if info is None:
                continue
            minor = int(info.parent.split("/gpu-")[1])
            mig.setdefault(info.profile, []).append((minor, info.start))
    return WalkOrder(tuple(whole), {k: tuple(v) for k, v in mig.items()})


def walks_for(gpus_per_node: Sequence[int]) -> dict[int, WalkOrder]:
    """Today's published walk for each node size the benchmark uses (8: hgx-h100, 4: gb200-nvl72)."""
    profile = {8: "hgx-h100", 4: "gb200-nvl72"}
    return {g: published_walk(profile[g]) for g in gpus_per_node}
