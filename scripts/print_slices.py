#!/usr/bin/env python3
"""Print the ResourceSlices the node driver publishes for a simulator profile.

    python scripts/print_slices.py hgx-h100              # the whole pool, as YAML documents
    python scripts/print_slices.py hgx-h100 --example gpu-0,gpu-0-mig-3g-40gb-4
                                             # gpu-0's counter slice and the named devices
    python scripts/print_slices.py --summary             # a Markdown table over every profile

The pool is built the production way: simulator -> gpuplane.driver.inventory.discover
-> gpuplane.driver.publish.slices.build_pool -> render_slices, and checked with validate_pool
before it is printed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuplane.driver.hw import sim_profiles
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import discover
from gpuplane.driver.publish.slices import build_pool, render_slices, validate_pool

EXAMPLE_CLUSTER_UUID = "6f1c2d3e-4b5a-4978-8a9b-0c1d2e3f4a5b"

# (label, profile, MIG on for every GPU) rows of the summary table.
SUMMARY_ROWS: tuple[tuple[str, str, bool], ...] = (
    ("hgx-h100", "hgx-h100", False),
    ("hgx-h200", "hgx-h200", False),
    ("h100-nvl-pcie", "h100-nvl-pcie", False),
    ("gb200-nvl72", "gb200-nvl72", False),
    ("a100-40gb (MIG off)", "a100-40gb", False),
    ("a100-40gb (MIG on)", "a100-40gb", True),
    ("pcie-l4", "pcie-l4", False),
)


def pool(
    profile: str,
    node: str = "node-a",
    mig_on: bool = False,
    cluster_uuid: str | None = None,
    clique_id: int | None = None,
) -> list[dict[str, Any]]:
    """The rendered, validated slices of one simulated node (generation 1)."""
    count = sim_profiles.node_profile(profile).gpu_count
    state = Path(tempfile.mkdtemp(prefix="print-slices-"))
    try:
        if profile == "gb200-nvl72" and cluster_uuid is None:
            cluster_uuid, clique_id = EXAMPLE_CLUSTER_UUID, 1 if clique_id is None else clique_id
        config = SimConfig(
            profile=profile,
            state_dir=state,
            node_name=node,
            durable=False,
            cluster_uuid=cluster_uuid,
            clique_id=clique_id,
            initial_mig_mode={i: True for i in range(count)} if mig_on else {},
        )
        sim = Simulator(config)
        sim.init()
        try:
            slices = render_slices(build_pool(discover(node, sim)), 1)
        finally:
            sim.shutdown()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    validate_pool(slices)
    return slices


def example(slices: Sequence[dict[str, Any]], devices: Sequence[str]) -> list[dict[str, Any]]:
    """The counter slices of the GPUs behind ``devices``, then the slice holding them cut to just those."""
    gpus = {"-".join(d.split("-")[:2]) for d in devices}
    out: list[dict[str, Any]] = [
        {**s, "spec": {**s["spec"], "sharedCounters": picked}}
        for s in slices
        if (picked := [c for c in s["spec"].get("sharedCounters") or [] if c["name"][: -len("-counters")] in gpus])
    ]
    for s in slices:
        kept = [d for d in s["spec"].get("devices") or [] if d["name"] in devices]
        if kept:
            out.append({**s, "spec": {**s["spec"], "devices": kept}})
    return out


def summary_table() -> str:
    lines = [
        "| profile | GPUs | whole-GPU devices | MIG devices | devices | counter-set slices "
        "| device slices | slices | most devices in one slice |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, profile, mig_on in SUMMARY_ROWS:
        slices = pool(profile, mig_on=mig_on)
        devices = [d for s in slices for d in s["spec"].get("devices") or []]
        whole = sum(1 for d in devices if d["attributes"]["type"]["string"] == "gpu")
        counter_slices = sum(1 for s in slices if s["spec"].get("sharedCounters"))
        device_slices = sum(1 for s in slices if s["spec"].get("devices"))
        widest = max(len(s["spec"].get("devices") or []) for s in slices)
        gpus = sim_profiles.node_profile(profile).gpu_count
        lines.append(
            f"| {label} | {gpus} | {whole} | {len(devices) - whole} | {len(devices)} | {counter_slices} "
            f"| {device_slices} | {len(slices)} | {widest} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", nargs="?", choices=sim_profiles.PROFILE_NAMES, default="hgx-h100")
    parser.add_argument("--node", default="node-a", help="node name (= pool name)")
    parser.add_argument("--mig-on", action="store_true", help="start every GPU in MIG mode (A100: MIG on)")
    parser.add_argument("--cluster-uuid", help="fabric cluster UUID (gb200-nvl72)")
    parser.add_argument("--clique-id", type=int, help="fabric clique id (gb200-nvl72)")
    parser.add_argument("--example", metavar="DEVICES", help="only these devices (comma list) and their counters")
    parser.add_argument("--summary", action="store_true", help="Markdown table of every profile")
    args = parser.parse_args(argv)
    if args.summary:
        print(summary_table())
        return 0
    slices = pool(args.profile, args.node, args.mig_on, args.cluster_uuid, args.clique_id)
    if args.example is not None:
        slices = example(slices, args.example.split(","))
    yaml.safe_dump_all(slices, sys.stdout, sort_keys=False, default_flow_style=False, width=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
