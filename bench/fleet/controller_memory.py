"""The controller's memory at fleet scale, before and after, on one cluster in one run, in minutes.

    python -m bench controller_memory [--hgx 800] [--gb200 200] [--claims 10000] [--with-pods 2800]
        [--gangs 100] [--before REV | --sides NAME=REV,...] [--hold 60] [--trace-memory N]
        [--state-dir DIR] [--write FILE]

The issue-17 target is the controller's resident memory at 1,000 nodes and 10,000 claims (<= 200
MB). ``bench.fleet.fleet_scale`` reaches that state through kube-scheduler in about 30 minutes; this
bench builds the same state in a few (``bench.fleet.fleet_state``: the claims allocated as the scheduler
would, their pods bound), so a change to the controller's memory can be measured side by side:

1. the cluster: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, KWOK; ``--hgx`` HGX
   H100 nodes and ``--gb200`` GB200 trays published by the driver's own code under each node's
   identity (as ``bench.fleet.fleet_scale``);
2. one controller of this tree (the warm-up leader) while the claims, pods and ``--gangs`` TP=8
   gangs are created, until every gang is placed and its members Running; then it is stopped;
3. for each side of ``--sides`` in turn (``NAME=REV``: ``git archive REV``; ``NAME=tree``: this
   tree; ``NAME=tree+trace``: this tree with allocation tracing, whose report then says where the
   live memory was allocated, tracing adding its own), a controller of that code starts as the only
   replica on everything in place, as after an upgrade: until it leads and has been quiet (under 25 %
   of a CPU for 10 s), then ``--hold`` seconds more; its RSS, its peak (``VmHWM``), its CPU and its
   own memory report (``kill -USR2``) are read, and it is stopped before the next side starts.
   ``--before REV`` is ``--sides before=REV,after=tree``.

Prints one table (every side, and the last against the first, then the warm-up leader as ``lived``:
its figures once quiet after the gangs, its peak covering the whole build) and each one's memory
report; ``--write`` appends them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from kubernetes import client, config  # noqa: E402

from bench.fleet import fleet_before, fleet_controller, fleet_probe, fleet_state  # noqa: E402
from e2e.cluster import build, controlplane, kwok, procs  # noqa: E402
from e2e.cluster import handle as cluster  # noqa: E402
from e2e.cluster.controlplane import free_port  # noqa: E402
from e2e.plane import components, fleet, fleetslices, identity  # noqa: E402
from gpuplane import logs  # noqa: E402

TARGET_MB = 200.0
WARM = "lived"  # the warm-up leader: started on the fleet, through the claims and the gangs
Printer = Callable[[str], None]


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def measure(
    handle: cluster.Cluster, state_dir: Path, side: str, tree: Path, *, args: argparse.Namespace, say: Printer
) -> tuple[dict[str, float], str]:
    """Start ``tree``'s controller as the only replica; its figures once quiet plus ``--hold`` s, and its report."""
    who = identity.controller_identity(handle, components.identities_dir(state_dir), seconds=6 * 3600)
    replica = f"gpuplane-controller-{side}"
    taken: set[int] = set()
    argv = components.controller_argv(who.kubeconfig, replica, free_port(taken), free_port(taken))
    argv = [sys.executable, "-m", "gpuplane.controller.main", *argv[fleet_before._skip(argv) :]]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if side in args.traced:
        env["PYTHONTRACEMALLOC"] = str(args.trace_memory)
    t0 = time.monotonic()
    proc, record = procs.spawn(
        f"controller-{side}",
        argv,
        log=state_dir / "logs" / f"{replica}.log",
        pid_dir=state_dir / "pids",
        env=env,
        cwd=tree,
        die_with_parent=True,
    )
    pid = record.pid
    timeline: list[tuple[float, float]] = []  # (seconds since start, RSS MB), every 5 s
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(5.0):
            timeline.append((time.monotonic() - t0, _status_kb(pid, "VmRSS") / 1024))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        while components.lease_holder(handle.api) != replica:
            if proc.poll() is not None:
                raise RuntimeError(f"controller {side} exited ({proc.returncode}); see {record.log}")
            if time.monotonic() - t0 > args.timeout:
                raise RuntimeError(f"controller {side} did not take the Lease in {args.timeout:.0f} s")
            time.sleep(0.5)
        leader_s = time.monotonic() - t0
        quiet_s = fleet_controller.settle(pid, args.timeout)
        say(f"  {side}: leader after {leader_s:.1f} s, quiet after {quiet_s:.0f} s; holding {args.hold:.0f} s ...")
        time.sleep(args.hold)
        figures = {
            "leader s": leader_s,
            "quiet s": quiet_s,
            "RSS MB": _status_kb(pid, "VmRSS") / 1024,
            "peak RSS MB": _status_kb(pid, "VmHWM") / 1024,
            "CPU s": fleet_probe.cpu_s(pid),
        }
        report = fleet_controller.memory_report(pid)
    finally:
        stop.set()
        procs.stop(record, proc)
    say(f"  {side}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    report = "RSS every 5 s (MB): " + " ".join(f"{mb:.0f}" for _, mb in timeline) + "\n" + report
    return figures, report


def lived(pid: int, args: argparse.Namespace, say: Printer) -> tuple[dict[str, float], str]:
    """The warm-up leader's figures once quiet after the claims and gangs (plus ``--hold``), and its report."""
    quiet_s = fleet_controller.settle(pid, args.timeout)
    time.sleep(args.hold)
    figures = {
        "leader s": float("nan"),
        "quiet s": quiet_s,
        "RSS MB": _status_kb(pid, "VmRSS") / 1024,
        "peak RSS MB": _status_kb(pid, "VmHWM") / 1024,
        "CPU s": fleet_probe.cpu_s(pid),
    }
    say(f"  {WARM}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    return figures, fleet_controller.memory_report(pid)


def table(rows: dict[str, dict[str, float]], commits: dict[str, str]) -> str:
    """Every side's figures, and the last side's against the first's."""
    sides = list(rows)
    keys = list(next(iter(rows.values())))
    measured = [s for s in sides if s != WARM]
    first, last = measured[0], measured[-1]
    ratio = len(measured) > 1
    head = "| figure | " + " | ".join(f"{s} ({commits[s]})" for s in sides)
    out = [head + (f" | {last}/{first} |" if ratio else " |"), "|---" * (len(sides) + 1 + ratio) + "|"]
    for k in keys:
        cells = [f"{rows[s][k]:.1f}" for s in sides]
        if ratio:
            cells.append(f"{rows[last][k] / max(rows[first][k], 1e-9):.2f}")
        out.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def parse_sides(text: str) -> list[tuple[str, str]]:
    """``NAME=REV,...`` as (name, rev) pairs in order (REV ``tree`` or ``tree+trace``: this tree)."""
    pairs = [item.strip().partition("=") for item in text.split(",") if item.strip()]
    bad = [f"{n}{e}{r}" for n, e, r in pairs if not n or not e or not r]
    names_ = [n for n, _, _ in pairs]
    if bad or not pairs or len(set(names_)) != len(names_):
        raise SystemExit(f"--sides takes distinct NAME=REV items, got {text!r}")
    return [(n, r) for n, _, r in pairs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hgx", type=int, default=800, help="HGX H100 nodes")
    p.add_argument("--gb200", type=int, default=200, help="GB200 trays (NVL72 racks of 18)")
    p.add_argument("--claims", type=int, default=10000, help="background claims")
    p.add_argument("--with-pods", type=int, default=2800, help="of them allocated, each with a bound pod")
    p.add_argument("--gangs", type=int, default=100, help="TP=8 gangs placed by the warm-up leader")
    p.add_argument("--before", help="git revision of the 'before' controller (--sides before=REV,after=tree)")
    p.add_argument("--sides", default="after=tree", help="NAME=REV,...: the controllers measured, in order")
    p.add_argument("--hold", type=float, default=60.0, help="seconds each side runs after it is quiet")
    p.add_argument("--trace-memory", type=int, default=8, help="frames a tree+trace side keeps (PYTHONTRACEMALLOC)")
    p.add_argument("--workers", type=int, default=4, help="client threads creating objects")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds any one wait may take")
    p.add_argument("--state-dir", type=Path, help="keep the cluster's state here (default: a temporary directory)")
    p.add_argument("--write", type=Path, help="append the report as a Markdown section to this file")
    args = p.parse_args(argv)
    chosen = parse_sides(f"before={args.before},after=tree" if args.before else args.sides)
    sides = [name for name, _ in chosen]
    args.traced = {name for name, rev in chosen if rev == "tree+trace"}
    say: Printer = lambda text: print(text, flush=True)  # noqa: E731
    logs.configure("WARNING", "console")
    say(f"machine: {fleet_probe.machine()}; load average before: {fleet_probe.load_average()}")
    bins = build.ensure_binaries(out=say)
    kwok_bin = kwok.ensure_kwok(out=say)
    tmp = None if args.state_dir else tempfile.mkdtemp(prefix="ctl-memory-")
    state_dir = (args.state_dir or Path(str(tmp))).resolve()
    trees: dict[str, Path] = {}
    commits: dict[str, str] = {}
    for name, rev in chosen:
        if rev in ("tree", "tree+trace"):
            trees[name] = REPO_ROOT
            commits[name] = "this tree" + (f", PYTHONTRACEMALLOC={args.trace_memory}" if rev != "tree" else "")
        else:
            trees[name] = state_dir / f"tree-{name}"
            commits[name] = fleet_before.extract(rev, trees[name])
    memlimit = fleet_probe.apiserver_memlimit("auto")
    plane = controlplane.ControlPlane(
        state_dir,
        bins,
        die_with_parent=True,
        client_qps=500,
        component_env={"kube-apiserver": {"GOMEMLIMIT": memlimit}} if memlimit else None,
        out=lambda _: None,
    )
    nodes = fleet.plan(args.hgx, args.gb200)
    kubeconfig = plane.start()
    handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
    api_cfg = client.Configuration()
    load: Callable[..., None] = config.load_kube_config
    load(config_file=str(kubeconfig), client_configuration=api_cfg, persist_config=False)
    api_cfg.connection_pool_maxsize = 4 * args.workers
    api = client.ApiClient(api_cfg)
    kw = kwok.Kwok(state_dir, kwok_bin, kubeconfig, die_with_parent=True, out=say)
    warm: components.Controllers | None = None
    rows: dict[str, dict[str, float]] = {}
    reports: dict[str, str] = {}
    started = time.monotonic()
    try:
        components.install(handle, out=say)
        kw.start()
        fleet.create_nodes(api, nodes, workers=args.workers, out=say)
        fleet.wait_ready(api, nodes, timeout=args.timeout, out=say)
        fs = fleetslices.FleetSlices(handle, nodes, state_dir / "sim", workers=args.workers, out=say)
        fs.mint_identities()
        fs.discover()
        fs.publish(what="publish: gpuplane's slices")
        warm = components.Controllers(state_dir, handle, replicas=1, token_seconds=6 * 3600, die_with_parent=True)
        warm.start()
        counts = fleet_state.populate(api, nodes, args.claims, args.with_pods, workers=args.workers, out=say)
        say(f"claims: {counts}")
        gangs = fleet_controller.place_gangs(api, args.gangs, args.timeout, say) if args.gangs else None
        if gangs is not None:
            say(f"gangs: {gangs.phase_running}/{gangs.gangs} Running, {gangs.one_domain} in one NVLink domain")
        warm_pid = procs.read_records(state_dir / "pids")[f"{components.CONTROLLER_PREFIX}0"].pid
        warm_row, warm_report = lived(warm_pid, args, say)
        warm.stop()
        warm = None
        built = time.monotonic() - started
        say(f"state built in {built:.0f} s; measuring {', '.join(sides)} one after the other ...")
        for side in sides:
            rows[side], reports[side] = measure(handle, state_dir, side, trees[side], args=args, say=say)
        rows[WARM], reports[WARM] = warm_row, warm_report
        commits[WARM] = "this tree"
    finally:
        if warm is not None:
            warm.stop()
        kw.stop()
        close: Callable[[], None] = api.close
        close()
        handle.close()
        plane.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    what = (
        f"{len(nodes)} nodes ({args.hgx} HGX H100 + {args.gb200} GB200), {args.claims} claims "
        f"({counts['allocated']} allocated with a bound pod, {counts['pending']} pending), {args.gangs} TP=8 gangs"
    )
    text = (
        f"controller started on {what}; figures once quiet plus {args.hold:.0f} s "
        f"(target <= {TARGET_MB:.0f} MB RSS)\n\n{table(rows, commits)}"
    )
    for side, report in reports.items():
        text += f"\n#### {side}: the controller's memory report\n\n```text\n{report}```\n"
    say(text)
    if args.write:
        command = shlex.join(list(argv) if argv is not None else sys.argv[1:])
        header = (
            f"\n### Controller memory ({datetime.date.today()}): `python -m bench controller_memory {command}`\n\n"
            f"Machine: {fleet_probe.machine()}; load average after: {fleet_probe.load_average()}.\n\n"
        )
        with args.write.open("a") as f:
            f.write(header + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
