"""Placement benchmark on the Alibaba GPU trace (2023, "openb"): gpuplane against first-fit, best-fit, spread.

Run ``python -m bench placement_bench --quick`` (about 2 minutes) or without
``--quick`` for the full run; ``--write-docs`` puts the report into
docs/placement.md. Cite Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23,
when quoting results on this trace.

Everything here is single-threaded and seeded; the numbers it prints are the
numbers it measured, targets included (PASS/FAIL with the margin). The trace and its workloads:
:mod:`bench.placement.trace`; the tables and targets: :mod:`bench.placement.placement_report`; decision latency:
:mod:`bench.placement.placement_latency`. This module: one replay and the command line.
"""

from __future__ import annotations

import argparse
import heapq
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import docs_results
from bench.placement.placement_deciders import Decider, Placer, make_policy
from bench.placement.placement_latency import latency_curve
from bench.placement.placement_report import (
    LEVERS,
    POLICIES,
    Check,
    Run,
    avg,
    checks_for,
    compact,
    percentile,
    shape_table,
    steering_checks,
    table,
)
from bench.placement.trace import (
    DEFAULT_TRACE,
    DURATION_CAP_S,
    FILES,
    HGX,
    MAPPING,
    NVL72,
    REPO,
    Topology,
    Workload,
    load_pods,
    load_workload,
    size_mix,
    trace_time_workload,
    units,
)
from gpuplane.placement import fragmentation, geometry, model, place, policies, snapshot

SAMPLES = 200

FRAG_DEF = """\
Fragmentation (after FGD, ATC '23): draw a request shape r from the file's own size mix (by count);
  its fragment is the free capacity (GPU units, free MIG compute slices as sevenths) that r could not
  use: for a MIG profile, free capacity on GPUs without a free placement of it; for a whole GPU, free
  capacity on partly used GPUs; for a TP group, all free capacity of domains that cannot host it, else
  partly used GPUs plus empty GPUs on nodes too small for a member. Reported: the expectation over the
  mix, time-averaged over 200 evenly spaced samples, in GPUs (and as % of free capacity).
Slivers = free capacity on partly used GPUs (GPU units). TP8 domains = domains able to take a TP8 group.
Wait = time from arrival to placement; requests still waiting at the end count with their wait so far.
  "incl. warm start" adds the warm-start requests that did not fit at time 0, waiting from 0."""


# --- one replay --------------------------------------------------------------


def crossings(r: model.Request, d: model.Decision) -> int:
    """TP groups of a decision whose members sit in more than one domain."""
    mpg = r.members_per_group
    groups: dict[int, set[str]] = {}
    for m in d.members:
        groups.setdefault(m.member // mpg, set()).add(m.domain)
    return sum(1 for doms in groups.values() if len(doms) > 1)


def measure(
    snap: snapshot.Snapshot, frag: fragmentation.Fragmentation, slots: geometry.Slots, topo: Topology
) -> tuple[float, float, float, float, float]:
    """(fragmentation, free, slivers, TP8-capable domains, used) of one snapshot, in GPU units."""
    free = slivers = 0.0
    tp8 = 0
    for di, d in enumerate(snap.domains):
        sig = d.signature
        free += sum(sig)
        tp8 += fragmentation.tp_capable(sig, topo.gpus_per_node, 8)
        for st, n in snap.state_counts(di).items():
            f = slots.free_units(st)
            free += n * f
            slivers += n * f
    return frag.of(snap), free, slivers, float(tp8), topo.gpus - free


Probe = Callable[[snapshot.Snapshot, Sequence[model.Decision]], None]


def replay(
    topo: Topology,
    policy: Decider,
    work: Workload,
    mix: fragmentation.SizeMix,
    probe: Probe | None = None,
) -> Run:
    """Replay ``work`` on an empty ``topo`` fleet: FIFO queue with backfill, departures after each duration.

    ``probe``, if given, sees the snapshot and the running decisions at every sample time (analysis only).
    """
    t0 = time.perf_counter()
    placer = policy if isinstance(policy, Placer) else None
    snap = snapshot.uniform_cluster(topo.domains, topo.nodes_per_domain, topo.gpus_per_node)
    slots = snap.slots
    frag = fragmentation.Fragmentation(mix, slots)
    run = Run()
    lat: list[int] = []
    deps: list[tuple[float, int, model.Decision]] = []
    seq = 0

    # Warm start: the population running at time 0 goes first (index < npre, never measured);
    # whatever does not fit waits at the head of the queue like any request.
    npre = len(work.prefill)
    reqs = [r for r, _ in work.prefill] + work.requests
    arr = [0.0] * npre + work.arrivals
    dur = [res for _, res in work.prefill] + work.durations
    end = arr[-1]
    samples = [end * (i + 0.5) / SAMPLES for i in range(SAMPLES)]
    si = 0
    waiting: dict[int, None] = {}  # insertion-ordered: arrival order, which is queue order here
    failed: set[fragmentation.Shape] = set()
    shapes = [fragmentation.shape_of(r) for r in reqs]
    # Shapes waiting in the queue, told to every policy before each decision (the operator knows its
    # queue too); first-fit, best-fit and spread ignore it.
    queued: dict[fragmentation.Shape, int] = {}

    def enqueue(i: int) -> None:
        waiting[i] = None
        queued[shapes[i]] = queued.get(shapes[i], 0) + 1

    def dequeue(i: int) -> None:
        del waiting[i]
        queued[shapes[i]] -= 1

    def decide(i: int) -> model.Decision:
        own = i in waiting
        if own:
            queued[shapes[i]] -= 1  # the request being placed is not part of what waits behind it
        a = time.perf_counter_ns()
        policies.base.observe_queue(policy, queued)  # type: ignore[arg-type]
        d = placer.place(reqs[i], snap) if placer is not None else place.place(reqs[i], snap, policy)  # type: ignore[arg-type]
        lat.append(time.perf_counter_ns() - a)
        if own:
            queued[shapes[i]] += 1
        return d

    started: dict[int, float] = {}
    acc = [0.0] * 5
    one_gpu = fragmentation.Shape()
    gpu_waiting = 0

    def sample() -> None:
        nonlocal gpu_waiting
        for k, v in enumerate(measure(snap, frag, slots, topo)):
            acc[k] += v
        gpu_waiting += queued.get(one_gpu, 0) > 0
        if probe is not None:
            probe(snap, [d for _, _, d in deps])

    def try_place(i: int, now: float) -> bool:
        nonlocal snap, seq
        d = decide(i)
        if not d.placed:
            failed.add(shapes[i])
            return False
        snap = snap.with_allocation(d)
        if placer is not None:
            placer.allocated(d)
        run.crossings += crossings(reqs[i], d)
        heapq.heappush(deps, (now + dur[i], seq, d))
        seq += 1
        started[i] = now
        return True

    for i in range(npre):
        if not try_place(i, 0.0):
            enqueue(i)
            run.dropped_prefill += 1
    lat.clear()

    ai = npre
    n = len(reqs)
    while ai < n:
        t_arr = arr[ai]
        t_dep = deps[0][0] if deps else math.inf
        t = min(t_arr, t_dep)
        while si < SAMPLES and samples[si] < t:
            sample()
            si += 1
        if t_dep <= t_arr:
            while deps and deps[0][0] == t_dep:
                gone = heapq.heappop(deps)[2]
                snap = snap.with_release(gone)
                if placer is not None:
                    placer.released(gone)
            failed.clear()
            for i in list(waiting):
                if shapes[i] not in failed and try_place(i, t_dep):
                    dequeue(i)
        else:
            if shapes[ai] in failed or not try_place(ai, t_arr):
                enqueue(ai)
            ai += 1
    while si < SAMPLES:
        sample()
        si += 1
    fr, free, sliv, tp8, used = (a / SAMPLES for a in acc)
    waits = [started[i] - arr[i] if i in started else end - arr[i] for i in range(npre, n)]
    run.placed = sum(1 for i in started if i >= npre)
    run.waiting_end = sum(1 for i in waiting if i >= npre)
    run.wait_mean = statistics.fmean(waits)
    run.wait_p99 = percentile(waits, 0.99)
    mig_w = [w for i, w in zip(range(npre, n), waits, strict=True) if reqs[i].mig_profile is not None]
    whole_w = [w for i, w in zip(range(npre, n), waits, strict=True) if reqs[i].mig_profile is None]
    run.wait_mig = statistics.fmean(mig_w) if mig_w else 0.0
    run.wait_whole = statistics.fmean(whole_w) if whole_w else 0.0
    u = [units(reqs[i]) for i in range(npre, n)]
    groups: dict[str, list[tuple[bool, float]]] = {}
    for i, w in zip(range(npre, n), waits, strict=True):
        groups.setdefault(shapes[i].label(), []).append((i in started, w))
    run.by_shape = {
        k: (len(v), sum(1 for ok, _ in v if ok), statistics.fmean(w for _, w in v)) for k, v in sorted(groups.items())
    }
    run.wait_units = sum(a * b for a, b in zip(u, waits, strict=True)) / sum(u) if u else 0.0
    # The warm-start requests that did not fit at time 0 queue like any other (from 0: a lower bound).
    late = [i for i in range(npre) if started.get(i, end) > 0.0]
    run.prefill_waiting_end = sum(1 for i in late if i not in started)
    all_w = waits + [started.get(i, end) for i in late]
    all_u = u + [units(reqs[i]) for i in late]
    run.wait_all = statistics.fmean(all_w) if all_w else 0.0
    run.wait_all_units = sum(a * b for a, b in zip(all_u, all_w, strict=True)) / sum(all_u) if all_u else 0.0
    run.frag, run.frag_pct = fr, 100.0 * fr / free if free else 0.0
    run.slivers, run.tp8, run.util = sliv, tp8, 100.0 * used / topo.gpus
    run.gpu_waiting = 100.0 * gpu_waiting / SAMPLES
    run.decisions = len(lat)
    run.lat_p50_us = percentile(lat, 0.5) / 1000
    run.lat_p99_us = percentile(lat, 0.99) / 1000
    run.seconds = time.perf_counter() - t0
    return run


# --- main --------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer pods per replay (about 2 minutes)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--write-docs", action="store_true", help="write the report into docs/placement.md")
    ap.add_argument("--skip-trace-time", action="store_true")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--levers", action="store_true", help="also each steering lever alone (" + ", ".join(LEVERS) + ")")
    ap.add_argument("--files", default=",".join(FILES), help="trace files to replay (default: both)")
    ap.add_argument("--topologies", default="hgx,nvl72", help="fleets to replay (default: both)")
    ap.add_argument("--loads", default="1.0,1.2", help="offered loads (default: 1.0,1.2)")
    ap.add_argument("--compact", action="store_true", help="one line per policy (fragmentation, waits) per scenario")
    args = ap.parse_args(argv)
    columns = POLICIES + (LEVERS if args.levers else ())
    files = [f for f in args.files.split(",") if f]
    topos = [{"hgx": HGX, "nvl72": NVL72}[t] for t in args.topologies.split(",") if t]
    loads = [float(x) for x in args.loads.split(",") if x]
    limit = 2500 if args.quick else None
    lat_decisions = 2000 if args.quick else 5000
    cmd = (
        "python -m bench placement_bench"
        + (" --quick" if args.quick else "")
        + (f" --seeds {args.seeds}" if args.seeds != 5 else "")
        + (" --levers" if args.levers else "")
        + (f" --files {args.files}" if files != list(FILES) else "")
        + (f" --topologies {args.topologies}" if len(topos) != 2 else "")
        + (f" --loads {args.loads}" if loads != [1.0, 1.2] else "")
        + (" --compact" if args.compact else "")
    )
    out: list[str] = []

    def emit(line: str = "") -> None:
        out.append(line)
        print(line, flush=True)

    emit(f"# gpuplane placement benchmark ({cmd})")
    emit(MAPPING)
    emit(FRAG_DEF)
    emit(
        f"Load replay: pods in trace order (creation time), Poisson arrivals at offered load x capacity,"
        f" durations from the trace capped at {DURATION_CAP_S / 3600:.0f} h; warm start from the same"
        f" process; FIFO queue with backfill; {args.seeds} seeds; mean ± sd."
        + (f" --quick: first {limit} GPU pods of each file." if limit else "")
    )
    all_checks: list[Check] = []
    t_start = time.perf_counter()
    for fname in files:
        pods, skipped = load_pods(args.trace_dir / f"openb_pod_list_{fname}.csv")
        emit()
        emit(f"## {fname}: {len(pods)} GPU pods, {skipped} CPU-only pods skipped")
        for topo in topos:
            mix = size_mix(pods, topo)
            emit(f"size mix on {topo.name}: " + ", ".join(f"{s.label()} {100 * w:.1f}%" for s, w in mix.shapes))
            if not args.skip_trace_time:
                work = trace_time_workload(pods, topo, limit)
                runs = {p: [replay(topo, make_policy(p, mix, topo), work, mix)] for p in columns}
                emit()
                for line in table(f"### {fname} / {topo.name} / trace time (one run, no queueing pressure)", runs):
                    emit(line)
            for load in loads:
                runs = {p: [] for p in columns}
                for seed in range(args.seeds):
                    work = load_workload(pods, topo, load, seed, limit)
                    for p in columns:
                        runs[p].append(replay(topo, make_policy(p, mix, topo), work, mix))
                emit()
                scen = f"{fname} / {topo.name} / load {load}"
                for line in (compact if args.compact else table)(f"### {scen} ({args.seeds} seeds)", runs):
                    emit(line)
                for line in [] if args.compact else shape_table(runs):
                    emit(line)
                emit(
                    f"(prefill dropped: {avg(runs['gpuplane'], lambda r: r.dropped_prefill):.0f};"
                    f" wall {sum(r.seconds for rs in runs.values() for r in rs):.0f} s)"
                )
                all_checks.extend(checks_for(scen, topo, runs))
                all_checks.extend(steering_checks(scen, runs))
    if not args.skip_latency:
        pods, _ = load_pods(args.trace_dir / "openb_pod_list_default.csv")
        for topo in (HGX, NVL72):
            emit()
            emit(
                f"## Decision latency: gpuplane, {topo.name.split()[0]} layout, ~70% of GPUs used"
                " (whole or 1-3 MIG instances drawn from the default file's mix), the default file's"
                f" requests in order, {lat_decisions} decisions per size, each applied"
            )
            emit(f"{'nodes':>8}{'GPUs':>8}{'p50 (us)':>12}{'p99 (us)':>12}{'decisions/s':>14}")
            curve = latency_curve(pods, topo, (100, 1000, 3000, 10000), lat_decisions)
            for nodes, gpus, p50, p99, rate in curve:
                emit(f"{nodes:>8}{gpus:>8}{p50:>12.0f}{p99:>12.0f}{rate:>14.0f}")
            by = {n: (p99, rate) for n, _, _, p99, rate in curve}
            n1k = min(by, key=lambda n: abs(n - 1000))
            n10k = max(by)
            t = topo.name.split()[0]
            all_checks.append(
                Check(f"{t}: decision p99 < 1 ms at {n1k} nodes", by[n1k][0] < 1000, f"{by[n1k][0]:.0f} us")
            )
            all_checks.append(
                Check(f"{t}: decision p99 < 10 ms at {n10k} nodes", by[n10k][0] < 10000, f"{by[n10k][0]:.0f} us")
            )
            all_checks.append(
                Check(f"{t}: >= 1,000 decisions/s at {n10k} nodes", by[n10k][1] >= 1000, f"{by[n10k][1]:.0f}/s")
            )
    emit()
    emit("## Targets")
    for c in all_checks:
        emit(f"{'PASS' if c.ok else 'FAIL'}  {c.what}: {c.detail}")
    npass = sum(c.ok for c in all_checks)
    emit(f"{npass}/{len(all_checks)} targets met; total wall {time.perf_counter() - t_start:.0f} s")
    if args.write_docs:
        docs_results.write(REPO / "docs" / "placement.md", "Placement", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
