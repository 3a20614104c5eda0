"""Fleet scale: gpuplane's ResourceSlices for a KWOK fleet against the real scheduler, API server, etcd and controller.

    python -m bench.fleet_scale [--hgx 800] [--gb200 200] [--pods 300] [--claims 10000] [--gangs 100]
        [--skip sched,api,controller] [--write docs/benchmarks.md]

Builds, in its own loopback cluster (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager v1.36.3 and KWOK v0.8.0, all built from their Go modules and cached):

* ``--hgx`` HGX H100 nodes and ``--gb200`` GB200 trays (NVL72 racks of 18) as Node objects that
  KWOK keeps Ready (``e2e.plane.fleet``); pods bound to them are marked Running by KWOK;
* gpuplane installed from ``manifests/overlays/e2e`` (CRDs, DeviceClasses, RBAC, the driver's
  own-node admission policy);
* every node's ResourceSlices published by the driver's own discovery, builder and publisher,
  under that node's driver identity (``e2e.plane.fleetslices``);
* ``gpuplane-controller`` (one replica, its ServiceAccount token) running from the moment the
  fleet is published to the end.

Then, in one run:

1. kube-scheduler (``bench.fleet_sched``): ``--pods`` pods per round without claims (c), with a MIG
   1g, a whole-GPU and a 4-GPU ``matchAttribute`` claim on the slices as published (a), and the
   whole-GPU kinds again after every node republished whole GPUs only (b);
2. the API server and etcd (``bench.fleet_api``): slice objects, devices and bytes as served and as
   stored for (a) and (b); one fleet-wide republish after a health change and one after it clears,
   with watch events and bytes per second; resident memory of every component;
3. the controller (``bench.fleet_controller``): start-up on the fleet, ``--claims`` background
   claims with Running pods, then ``--gangs`` TP=8 gangs placed all-or-nothing in NVL72 domains;
   its resident memory (target <= 200 MB) and CPU.

Prints every table, the load average before and after, and the busiest other processes on the
machine; ``--write FILE`` appends the report to FILE. Everything is stopped and the state
directory removed at the end (``--state-dir`` keeps it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import dra_overhead, fleet_api, fleet_controller, fleet_probe, fleet_sched  # noqa: E402
from e2e.cluster import build, controlplane, kwok  # noqa: E402
from e2e.cluster import handle as cluster  # noqa: E402
from e2e.plane import components, fleet, fleetslices  # noqa: E402
from gpuplane.driver import logs  # noqa: E402

RSS_TARGET_MB = 200.0


def machine() -> str:
    """CPU model, CPU count, memory and Python version."""
    cpu = "unknown CPU"
    mem = "?"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    with contextlib.suppress(OSError, StopIteration, ValueError):
        kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line)
        mem = f"{kb / 2**20:.0f} GiB"
    return f"{os.cpu_count()} CPUs ({cpu}), {mem} memory, Python {platform.python_version()}, {platform.system()}"


def others(probe: fleet_probe.Probe | None) -> str:
    """The busiest processes outside this benchmark, over 3 s."""
    mine = {os.getpid(), *(probe.pids().values() if probe else ())}
    top = fleet_probe.busiest(exclude=mine)
    return ", ".join(f"{name} {cpus:.2f}" for name, cpus in top) or "none above 0.02 CPUs"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--hgx", type=int, default=800, help="HGX H100 nodes (8 GPUs, MIG partitionable)")
    p.add_argument("--gb200", type=int, default=200, help="GB200 trays (4 GPUs; 18 per NVL72 rack)")
    p.add_argument("--pods", type=int, default=300, help="pods per scheduler round")
    p.add_argument("--rounds", type=int, default=1, help="scheduler rounds per kind")
    p.add_argument("--claims", type=int, default=10_000, help="background claims for the controller measurement")
    p.add_argument("--gangs", type=int, default=None, help="TP=8 gangs (default: one per two GB200 trays, <= 100)")
    p.add_argument("--workers", type=int, default=8, help="client threads creating objects")
    p.add_argument("--api-qps", type=int, default=500, help="client QPS of kube-scheduler and -controller-manager")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds any one wait may take")
    p.add_argument("--skip", default="", help="comma-separated: sched, api, controller")
    p.add_argument("--state-dir", type=Path, help="keep the cluster's state here (default: a temporary directory)")
    p.add_argument("--write", type=Path, help="append the report as a Markdown section to this file")
    args = p.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    gangs = args.gangs if args.gangs is not None else min(100, args.gb200 // 2)
    say: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    logs.configure("WARNING", "console")
    report: list[str] = []

    def section(title: str, body: str) -> None:
        say(f"\n### {title}\n\n{body}")
        report.append(f"\n### {title}\n\n{body}")

    load_before = fleet_probe.load_average()
    say(f"machine: {machine()}; load average before: {load_before}")
    busy_before = others(None)
    say(f"busiest other processes (CPUs): {busy_before}")
    bins = build.ensure_binaries(out=say)
    kwok_bin = kwok.ensure_kwok(out=say)
    tmp = tempfile.mkdtemp(prefix="fleet-bench-")
    state_dir = (args.state_dir or Path(tmp)).resolve()
    plane = controlplane.ControlPlane(
        state_dir, bins, die_with_parent=True, client_qps=args.api_qps, out=lambda _: None
    )
    nodes = fleet.plan(args.hgx, args.gb200)
    started = time.monotonic()
    say(f"starting the control plane in {state_dir} ...")
    kubeconfig = plane.start()
    handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
    api = handle.api
    kw = kwok.Kwok(state_dir, kwok_bin, kubeconfig, die_with_parent=True, out=say)
    probe = fleet_probe.Probe(state_dir, kubeconfig)
    slices = fleetslices.FleetSlices(handle, nodes, state_dir / "sim", workers=args.workers, out=say)
    ctl: components.Controllers | None = None
    memory_columns: list[tuple[str, dict[str, float]]] = []
    try:
        components.install(handle, out=say)
        kw.start()
        say(f"fleet: {args.hgx} x hgx-h100 + {args.gb200} x gb200-nvl72 ({len(nodes)} nodes) ...")
        fleet.create_nodes(api, nodes, workers=args.workers, out=say)
        fleet.wait_ready(api, nodes, timeout=args.timeout, out=say)
        slices.mint_identities()
        who = slices.whoami(nodes[0].name)
        slices.discover()
        first = slices.publish(what="publish (a): gpuplane's slices")
        fleet_built = time.monotonic() - started
        say(f"fleet built in {fleet_built:.0f}s")
        probe.extra_pids["fleet bench (this process: 1,000 publishers)"] = os.getpid()
        memory_columns.append(("fleet published", fleet_api.memory(probe)))
        footprints = [("(a) gpuplane's slices", fleet_api.slice_footprint(api, probe))]
        moments: list[fleet_controller.Moment] = []
        sampler: fleet_controller.RssSampler | None = None
        ctl_pid = 0
        if "controller" not in skip:
            t0 = time.monotonic()
            ctl, ctl_pid = fleet_controller.start_controller(handle, state_dir, say)
            sampler = fleet_controller.RssSampler(ctl_pid)
            sampler.start()
            cpu0 = fleet_probe.cpu_s(ctl_pid)
            dra_overhead.wait(lambda: fleet_controller.unlabelled(api, nodes) == 0, args.timeout, "node labels")
            moments.append(
                fleet_controller.Moment(
                    "started on the fleet: every node labelled",
                    time.monotonic() - t0,
                    fleet_probe.rss_mb(ctl_pid),
                    sampler.peak,
                    fleet_probe.cpu_s(ctl_pid) - cpu0,
                    f"{len(nodes)} nodes, {footprints[0][1].objects} slices, {footprints[0][1].devices} devices",
                )
            )
            memory_columns.append(("controller synced", fleet_api.memory(probe)))
        rounds: list[fleet_sched.Round] = []
        passes: list[fleet_api.Republish] = []
        fleet_sched.ensure_namespace(api)
        if "sched" not in skip:
            for r in range(args.rounds):
                for kind in fleet_sched.KINDS:
                    variant = "c" if kind == "none" else "a"
                    say(f"round {r + 1}/{args.rounds} ({variant}): {args.pods} pods, {fleet_sched.KIND_TEXT[kind]} ...")
                    rounds.append(
                        fleet_sched.run_round(
                            api,
                            probe,
                            fleet_variant=variant,
                            kind=kind,
                            pods=args.pods,
                            label=f"{variant}-{kind}-{r}",
                            timeout=args.timeout,
                            workers=args.workers,
                            out=say,
                        )
                    )
            memory_columns.append(("after rounds (a)", fleet_api.memory(probe)))
            say("republishing whole GPUs only (b) ...")
            slices.discover(mig_placements=False)
            passes.append(
                fleet_api.republish(slices, api, probe, what="(a) -> (b): whole GPUs only", taints=lambda _: {})
            )
            footprints.append(("(b) whole GPUs only", fleet_api.slice_footprint(api, probe)))
            for r in range(args.rounds):
                for kind in ("gpu-1", "gpu-4"):
                    say(f"round {r + 1}/{args.rounds} (b): {args.pods} pods, {fleet_sched.KIND_TEXT[kind]} ...")
                    rounds.append(
                        fleet_sched.run_round(
                            api,
                            probe,
                            fleet_variant="b",
                            kind=kind,
                            pods=args.pods,
                            label=f"b-{kind}-{r}",
                            timeout=args.timeout,
                            workers=args.workers,
                            out=say,
                        )
                    )
            memory_columns.append(("after rounds (b)", fleet_api.memory(probe)))
            slices.discover()
            passes.append(
                fleet_api.republish(slices, api, probe, what="(b) -> (a): MIG placements back", taints=lambda _: {})
            )
            section("1. kube-scheduler: pods per round, creation to bound", fleet_sched.table(rounds))
            section("1. ratios", fleet_sched.ratios(rounds))
        if "api" not in skip:
            say("health change on every node (fatal Xid on gpu-3), then cleared ...")
            passes.append(
                fleet_api.republish(slices, api, probe, what="health: Xid taint on gpu-3", taints=fleet_api.xid_taints)
            )
            passes.append(fleet_api.republish(slices, api, probe, what="health: taint cleared", taints=lambda _: {}))
            passes.append(
                fleet_api.republish(slices, api, probe, what="unchanged (periodic resync)", taints=lambda _: {})
            )
        section("2. ResourceSlices as served (API) and stored (etcd)", fleet_api.footprint_table(footprints))
        if passes:
            section("2. fleet-wide publish passes: API calls and watch traffic", fleet_api.republish_table(passes))
        if "controller" not in skip and sampler is not None:
            t0 = time.monotonic()
            cpu0 = fleet_probe.cpu_s(ctl_pid)
            sampler.reset()
            bg = fleet_controller.background(api, probe, args.claims, args.timeout, say)
            say("  waiting 30 s for the controller to settle on the claims ...")
            time.sleep(30)
            bound = sum(r.bound for r in bg)
            moments.append(
                fleet_controller.Moment(
                    f"{args.claims} background claims allocated, pods Running",
                    time.monotonic() - t0,
                    fleet_probe.rss_mb(ctl_pid),
                    sampler.peak,
                    fleet_probe.cpu_s(ctl_pid) - cpu0,
                    f"{bound}/{args.claims} bound; scheduler {bound / max(1e-9, sum(r.span_s for r in bg)):.1f} pods/s",
                )
            )
            memory_columns.append((f"{args.claims} claims", fleet_api.memory(probe)))
            if gangs:
                t0 = time.monotonic()
                cpu0 = fleet_probe.cpu_s(ctl_pid)
                sampler.reset()
                say(f"placing {gangs} TP=8 gangs ...")
                result = fleet_controller.place_gangs(api, gangs, args.timeout, say)
                moments.append(
                    fleet_controller.Moment(
                        f"{gangs} TP=8 gangs (2 x 4 GB200)",
                        time.monotonic() - t0,
                        fleet_probe.rss_mb(ctl_pid),
                        sampler.peak,
                        fleet_probe.cpu_s(ctl_pid) - cpu0,
                        f"{result.placed}/{result.gangs} Placed in {result.placed_s:.1f}s "
                        f"(creates {result.create_s:.1f}s); "
                        f"{result.members_running}/{2 * result.gangs} members Running in {result.running_s:.1f}s; "
                        f"{result.one_domain}/{result.gangs} in one NVLink domain on the placed nodes",
                    )
                )
                memory_columns.append((f"{gangs} gangs", fleet_api.memory(probe)))
            sampler.stop()
            section("3. gpuplane-controller", fleet_controller.moments_table(moments, RSS_TARGET_MB))
        section("2. resident memory (MB) of each component", fleet_api.memory_table(memory_columns))
        identity_line = (
            f"slices written as `{who['username']}` with node-name extra "
            f"{who['extra'].get('authentication.kubernetes.io/node-name')} (for node {nodes[0].name}), "
            "one token per node bound to a stand-in driver pod on that node; the admission policy "
            "gpuplane-driver-own-node-slices allowed every write"
        )
        say(identity_line)
        say(
            f"first publish: {first.nodes} nodes, {first.slices} slices, {first.devices} devices "
            f"in {first.seconds:.1f}s ({json.dumps(first.calls)})"
        )
    finally:
        load_after = fleet_probe.load_average()
        busy_after = others(probe)
        say(f"load average after: {load_after}; busiest other processes (CPUs): {busy_after}")
        if ctl is not None:
            ctl.stop()
        kw.stop()
        handle.close()
        plane.stop()
        if args.state_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
            say(f"removed {tmp}")
    if args.write:
        header = f"""
## Fleet scale: {len(nodes)} KWOK nodes of gpuplane's ResourceSlices ({datetime.date.today()})

`python -m bench.fleet_scale --hgx {args.hgx} --gb200 {args.gb200} --pods {args.pods} --rounds {args.rounds} \
--claims {args.claims} --gangs {gangs}{f" --skip {args.skip}" if args.skip else ""}`

Machine: {machine()}. Load average before: {load_before}; after: {load_after}.
Busiest other processes before (CPUs busy): {busy_before}; after: {busy_after}.
Fleet built in {fleet_built:.0f} s (control plane, KWOK, {len(nodes)} nodes, identities, first publish of
{first.slices} slices / {first.devices} devices in {first.seconds:.0f} s). {identity_line}.
kube-scheduler and kube-controller-manager run with `--kube-api-qps={args.api_qps}`.
"""
        with args.write.open("a") as f:
            f.write(header + "".join(report))
        say(f"appended the report to {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
