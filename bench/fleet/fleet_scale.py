"""Fleet scale: gpuplane's ResourceSlices for a KWOK fleet against the real scheduler, API server, etcd and controller.

    python -m bench fleet_scale [--hgx 800] [--gb200 200] [--pods 300] [--claims 10000] [--gangs 100]
        [--skip sched,api,controller,restart,publisher-before] [--write docs/benchmarks.md]

Builds, in its own loopback cluster (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager of the selected release, 1.37.2 by default, and KWOK v0.8.0, all built from
their Go modules and cached):

* ``--hgx`` HGX H100 nodes and ``--gb200`` GB200 trays (NVL72 racks of 18) as Node objects that
  KWOK keeps Ready (``e2e.plane.fleet``); pods bound to them are marked Running by KWOK;
* gpuplane installed from ``manifests/overlays/e2e`` (CRDs, DeviceClasses, RBAC, the driver's
  own-node admission policy);
* every node's ResourceSlices published by the driver's own discovery, builder and publisher,
  under that node's driver identity (``e2e.plane.fleetslices``);
* ``gpuplane-controller`` (one replica, its ServiceAccount token) running from the moment the
  fleet is published to the end.

Then, in one run:

1. kube-scheduler (``bench.fleet.fleet_sched``): ``--pods`` pods per round without claims (c), with a MIG
   1g, a whole-GPU and a 4-GPU ``matchAttribute`` claim on the slices as published (a), and the
   whole-GPU kinds again after every node republished whole GPUs only (b); with ``--newer-scheduler``
   the (a) kinds again on that kube-scheduler binary (a+), swapped in and back in the same run;
2. the API server and etcd (``bench.fleet.fleet_api``): slice objects, devices and bytes as served and as
   stored for (a) and (b); one fleet-wide republish after a health change and one after it clears,
   with watch events and bytes per second; resident memory of every component;
3. the controller (``bench.fleet.fleet_controller``): start-up on the fleet, ``--claims`` background
   claims with Running pods, then ``--gangs`` TP=8 gangs placed all-or-nothing in NVL72 domains;
   its resident memory (target <= 200 MB) and CPU.

Prints every table, the load average before and after, and the busiest other processes on the
machine; ``--write FILE`` appends the report to FILE. Everything is stopped and the state
directory removed at the end (``--state-dir`` keeps it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from kubernetes import client, config  # noqa: E402

from bench.dra import dra_watch  # noqa: E402
from bench.fleet import (  # noqa: E402
    fleet_api,
    fleet_before,
    fleet_controller,
    fleet_probe,
    fleet_sched,
    fleet_steps,
    fleet_tables,
    newer_scheduler,
    sched_pprof,
)
from bench.fleet.fleet_steps import took  # noqa: E402
from e2e.cluster import build, controlplane, kwok  # noqa: E402
from e2e.cluster import handle as cluster  # noqa: E402
from e2e.plane import components, fleet, fleetslices  # noqa: E402
from gpuplane import logs  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--hgx", type=int, default=800, help="HGX H100 nodes (8 GPUs, MIG partitionable)")
    p.add_argument("--gb200", type=int, default=200, help="GB200 trays (4 GPUs; 18 per NVL72 rack)")
    p.add_argument("--pods", type=int, default=300, help="pods per scheduler round")
    p.add_argument("--pods-a", type=int, default=None, help="pods per round on (a), the partitionable fleet (0: none)")
    p.add_argument("--pods-a0", type=int, default=None, help="pods per round on (a0), before packing (0: none)")
    p.add_argument(
        "--before",
        metavar="REV",
        help="also run the controller of git revision REV (the code before the fixes) beside this one, as followers",
    )
    p.add_argument("--rounds", type=int, default=1, help="scheduler rounds per kind")
    p.add_argument("--claims", type=int, default=None, help="background claims (default: 12.5 per HGX node)")
    p.add_argument("--gangs", type=int, default=None, help="TP=8 gangs (default: one per two GB200 trays, <= 100)")
    p.add_argument(
        "--share-pods",
        type=int,
        default=None,
        help="at most this many time-sliced share claims get a pod; the rest stay pending without one",
    )
    p.add_argument("--workers", type=int, default=8, help="client threads creating objects")
    p.add_argument("--api-qps", type=int, default=500, help="client QPS of kube-scheduler and -controller-manager")
    p.add_argument(
        "--apiserver-memlimit",
        default="auto",
        help="GOMEMLIMIT of kube-apiserver (Go syntax, e.g. 12GiB; 'auto': half the machine's memory; 'off': none): "
        "its garbage collector works harder near it instead of the kernel OOM-killing it in a re-list burst",
    )
    p.add_argument(
        "--report-over-target",
        action="store_true",
        help="diagnosis: the first time the controller's RSS passes the 200 MB target, take its memory report",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds any one wait may take")
    p.add_argument(
        "--skip",
        default="",
        help="comma-separated: sched, api, controller, restart, publisher-before (the health passes again with "
        "every change rewriting the pool, the publisher before the in-place fix), offer (the MIG-offer step)",
    )
    p.add_argument(
        "--mig-offer",
        choices=("controller", "all"),
        default="controller",
        help="(a): MIG placements under the controller's MIG offer (docs/mig-offer.md), or on every GPU (before)",
    )
    p.add_argument("--offer-requests", type=int, default=50, help="MIG requests of the MIG-offer step (skip: offer)")
    p.add_argument("--state-dir", type=Path, help="keep the cluster's state here (default: a temporary directory)")
    p.add_argument(
        "--trace-memory",
        type=int,
        default=0,
        metavar="FRAMES",
        help="diagnosis run: the controller traces its allocations (PYTHONTRACEMALLOC=FRAMES; its memory and CPU "
        "figures are then not the product's), and its memory report lists where the memory was allocated",
    )
    p.add_argument(
        "--controller-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the controller (repeatable), e.g. MALLOC_ARENA_MAX=2",
    )
    p.add_argument("--write", type=Path, help="append the report as a Markdown section to this file")
    p.add_argument(
        "--pprof",
        type=Path,
        metavar="DIR",
        help="take a CPU profile of kube-scheduler through each (a) round into DIR and report where its time went",
    )
    p.add_argument(
        "--scheduler",
        help="run this kube-scheduler binary instead of the cluster's for the whole run, or 'build' for the "
        "release e2e/cluster/schedbuild pins (a newer release's allocator; a scheduler newer than the API "
        "server is outside the supported version skew)",
    )
    p.add_argument(
        "--newer-scheduler",
        help="after the (a) rounds, swap in this kube-scheduler binary, or 'build' for the release "
        "e2e/cluster/schedbuild pins (1.37, whose allocator keeps node-local counter slices node-local; "
        "built once into the cache), repeat the (a) rounds on it (rows a+), and swap the cluster's back",
    )
    args = p.parse_args(argv)
    args.pods_a = args.pods if args.pods_a is None else args.pods_a
    args.pods_a0 = args.pods_a if args.pods_a0 is None else args.pods_a0
    args.claims = round(12.5 * args.hgx) if args.claims is None else args.claims
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    ctl_env = fleet_controller.env_pairs(args.controller_env)
    gangs = args.gangs if args.gangs is not None else min(100, args.gb200 // 2)
    say: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    logs.configure("WARNING", "console")

    load_before = fleet_probe.load_average()
    say(f"machine: {fleet_probe.machine()}; load average before: {load_before}")
    busy_before = fleet_steps.others(None)
    say(f"busiest other processes (CPUs): {busy_before}")
    bins = build.ensure_binaries(out=say)
    kwok_bin = kwok.ensure_kwok(out=say)
    newer = Path(args.newer_scheduler).resolve() if args.newer_scheduler else None
    if args.newer_scheduler == "build":
        newer = newer_scheduler.ensure(out=say)
    tmp = None if args.state_dir else tempfile.mkdtemp(prefix="fleet-bench-")
    state_dir = (args.state_dir or Path(str(tmp))).resolve()
    memlimit = fleet_probe.apiserver_memlimit(args.apiserver_memlimit)
    plane = controlplane.ControlPlane(
        state_dir,
        bins,
        die_with_parent=True,
        client_qps=args.api_qps,
        component_env={"kube-apiserver": {"GOMEMLIMIT": memlimit}} if memlimit else None,
        out=lambda _: None,
    )
    nodes = fleet.plan(args.hgx, args.gb200)
    started = time.monotonic()
    say(f"starting the control plane in {state_dir} ...")
    kubeconfig = plane.start()
    scheduler_version = f"kube-scheduler {build.read_pins(build.MODULE_DIR / 'go.mod').kubernetes} (the cluster's)"
    if args.scheduler:
        chosen = newer_scheduler.ensure(out=say) if args.scheduler == "build" else Path(args.scheduler).resolve()
        _, scheduler_version = fleet_probe.replace_scheduler(state_dir, chosen, gates=fleet_steps.NEWER_SCHEDULER_GATES)
        scheduler_version += f" ({chosen}, DRA feature gates only, " + fleet_steps.gates_text() + ")"
        say(f"kube-scheduler replaced: {scheduler_version}")
    handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
    api_cfg = client.Configuration()
    load: Callable[..., None] = config.load_kube_config
    load(config_file=str(kubeconfig), client_configuration=api_cfg, persist_config=False)
    api_cfg.connection_pool_maxsize = 4 * args.workers  # one connection per creating thread, watches besides
    bench_api = client.ApiClient(api_cfg)
    kw = kwok.Kwok(state_dir, kwok_bin, kubeconfig, die_with_parent=True, out=say)
    probe = fleet_probe.Probe(state_dir, kubeconfig)
    probe.extra_pids["fleet bench (this process: the nodes' publishers)"] = os.getpid()
    peaks = fleet_probe.PeakSampler(probe)
    peaks.start()
    run = fleet_steps.Run(
        args=args,
        skip=skip,
        api=bench_api,
        handle=handle,
        probe=probe,
        peaks=peaks,
        slices=fleetslices.FleetSlices(handle, nodes, state_dir / "sim", workers=args.workers, out=say),
        nodes=nodes,
        say=say,
    )
    if args.pprof and plane.pki is not None:
        out_dir = args.pprof.resolve()
        run.profiler = sched_pprof.SchedulerProfiler(state_dir, plane.pki.admin, plane.pki.ca.cert, out_dir)
    ctl: components.Controllers | None = None
    try:
        components.install(handle, out=say)
        kw.start()
        say(f"fleet: {args.hgx} x hgx-h100 + {args.gb200} x gb200-nvl72 ({len(nodes)} nodes) ...")
        fleet.create_nodes(run.api, nodes, workers=args.workers, out=say)
        fleet.wait_ready(run.api, nodes, timeout=args.timeout, out=say)
        run.slices.mint_identities()
        who = run.slices.whoami(nodes[0].name)
        first = fleet_steps.publish_first(run)
        fleet_built = time.monotonic() - started
        say(f"fleet built in {fleet_built:.0f}s")
        run.remember_memory("fleet published")
        run.footprints.append(("(a) gpuplane's slices", fleet_api.slice_footprint(run.api, probe)))
        measure_controller = "controller" not in skip
        if measure_controller:
            t0 = time.monotonic()
            ctl, run.ctl_pid = fleet_controller.start_controller(
                handle, state_dir, say, trace_frames=args.trace_memory, env=ctl_env
            )
            cpu0 = fleet_probe.cpu_s(run.ctl_pid)
            if args.report_over_target:
                fleet_steps.report_when_over_target(run)
            dra_watch.wait(lambda: fleet_controller.unlabelled(run.api, nodes) == 0, args.timeout, "node labels")
            fp = run.footprints[0][1]
            run.moment(
                "started on the fleet (a): every node labelled",
                t0,
                cpu0,
                f"{len(nodes)} nodes, {fp.objects} slices, {fp.devices} devices",
            )
            if args.before:
                run.before_commit = fleet_before.extract(args.before, state_dir / "before")
                say(f"controller before the fixes: {args.before} = {run.before_commit} ...")
                fleet_steps.start_followers(run, state_dir / "before", state_dir)
            run.remember_memory("controller synced")
        fleet_sched.ensure_namespace(run.api)
        if "sched" not in skip:
            fleet_steps.scheduler_rounds_a(run)
            if newer is not None:
                fleet_steps.newer_scheduler_rounds(run, state_dir, newer)
        if "sched" not in skip or measure_controller:
            fleet_steps.to_whole_gpus(run)
        detail = ""
        if measure_controller:
            t0, cpu0 = time.monotonic(), fleet_probe.cpu_s(run.ctl_pid)
            detail = fleet_steps.background_claims(run)
        if "sched" not in skip or measure_controller:
            fleet_steps.back_to_partitionable(run)
        if measure_controller:
            say("  waiting 30 s for the controller to settle on the claims and the republished slices ...")
            time.sleep(30)
            run.moment(f"{args.claims} background claims, fleet back to (a)", t0, cpu0, detail)
            run.remember_memory(f"{args.claims} claims")
        if "sched" not in skip:
            run.section("1. kube-scheduler: pods per round, creation to bound", fleet_tables.table(run.rounds))
            run.section("1. ratios", fleet_tables.ratios(run.rounds))
            if run.profiler is not None:
                where = sched_pprof.report(run.profiler)
                run.section("1. where kube-scheduler's CPU went in each (a) round (pprof)", where)
        if "api" not in skip:
            fleet_steps.health_passes(run)
        run.section("2. ResourceSlices as served (API) and stored (etcd)", fleet_api.footprint_table(run.footprints))
        if run.passes:
            run.section(
                "2. fleet-wide publish passes: API calls and watch traffic", fleet_api.republish_table(run.passes)
            )
        if measure_controller and gangs:
            t0, cpu0 = time.monotonic(), fleet_probe.cpu_s(run.ctl_pid)
            say(f"placing {gangs} TP=8 gangs ...")
            result = fleet_controller.place_gangs(run.api, gangs, args.timeout, say)
            run.moment(
                f"{gangs} TP=8 gangs (2 x 4 GB200)",
                t0,
                cpu0,
                f"{result.decided}/{result.gangs} decided by the controller {took(result.decided_s)} "
                f"(creates {result.create_s:.1f}s); {result.members_running}/{2 * result.gangs} members Running "
                f"{took(result.running_s)}; {result.phase_running}/{result.gangs} gangs Running "
                f"{took(result.phase_running_s)}; {result.one_domain}/{result.gangs} in one NVLink domain on the "
                "nodes the placement named",
            )
            run.remember_memory(f"{gangs} gangs")
        if measure_controller and gangs:
            fleet_steps.where_cpu_goes(run, "the leader after the gangs, nothing changing")
            say("asking the leader that lived through it all for its memory report (kill -USR2) ...")
            lived = fleet_controller.memory_report(run.ctl_pid)  # after its RSS was recorded: its own cost unseen
            run.section("3. what the long-lived leader's memory holds after the gangs", f"```text\n{lived}```")
        if measure_controller and "restart" not in skip:
            ctl = fleet_steps.restart(
                run,
                ctl,
                lambda: fleet_controller.start_controller(
                    handle, state_dir, say, trace_frames=args.trace_memory, env=ctl_env
                ),
                f"{len(nodes)} nodes, {args.claims} claims and pods, {gangs} gangs",
                timeout=min(args.timeout, 300.0),
            )
        if measure_controller:
            run.section(
                "3. gpuplane-controller", fleet_controller.moments_table(run.moments, fleet_steps.RSS_TARGET_MB)
            )
            say("asking the controller for its memory report (kill -USR2) ...")
            memory = fleet_controller.memory_report(run.ctl_pid)
            run.section("3. what the controller's memory holds (its own report)", f"```text\n{memory}```")
        if run.over_target:
            run.section("3. the controller's memory when it first passed the target", run.over_target[0])
        if run.followers is not None:
            run.section("3. controller before/after (followers)", run.followers.table(run.before_commit))
        run.memory.append(("peak over the run", dict(peaks.peaks)))
        run.section("2. resident memory (MB) of each component", fleet_api.memory_table(run.memory))
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
    except BaseException as exc:
        # Print what was measured before the failure (the tables are otherwise printed at the end) and what died.
        say(f"the run failed: {exc!r}")
        for line in fleet_steps.post_mortem(run):
            say(line)
        raise
    finally:
        peaks.stop()
        load_after = fleet_probe.load_average()
        busy_after = fleet_steps.others(probe)
        say(f"load average after: {load_after}; busiest other processes (CPUs): {busy_after}")
        if run.followers is not None:
            run.followers.stop()
        if ctl is not None:
            ctl.stop()
        kw.stop()
        bench_close: Callable[[], None] = bench_api.close
        bench_close()
        handle.close()
        plane.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            say(f"removed {tmp}")
    if args.write:
        command = shlex.join(list(argv) if argv is not None else sys.argv[1:])
        ctl_env_text = " ".join(args.controller_env) or "(as the Deployment)"
        header = f"""
## Fleet scale: {len(nodes)} KWOK nodes of gpuplane's ResourceSlices ({datetime.date.today()})

`python -m bench fleet_scale {command}`

Machine: {fleet_probe.machine()}. Load average before: {load_before}; after: {load_after}.
Busiest other processes before (CPUs busy): {busy_before}; after: {busy_after}.
Fleet built in {fleet_built:.0f} s (control plane, KWOK, {len(nodes)} nodes, identities, first publish of
{first.slices} slices / {first.devices} devices in {first.seconds:.0f} s). {identity_line}.
kube-scheduler and kube-controller-manager run with `--kube-api-qps={args.api_qps}`; kube-apiserver with
GOMEMLIMIT={memlimit or "(none)"}; controller environment: {ctl_env_text}; scheduler:
{scheduler_version}.{run.newer_version}
"""
        with args.write.open("a") as f:
            f.write(header + "".join(run.report))
        say(f"appended the report to {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
