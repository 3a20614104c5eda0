"""Placement benchmark on the Alibaba GPU trace (2023, "openb"): gpuplane against first-fit, best-fit, spread.

Run ``python -m bench.placement_bench --quick`` (about 2 minutes) or without
``--quick`` for the full run; ``--write-docs`` puts the report into
docs/placement.md. Cite Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23,
when quoting results on this trace.

Everything here is single-threaded and seeded; the numbers it prints are the
numbers it measured, targets included (PASS/FAIL with the margin).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import heapq
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuplane.controller.placement import fragmentation, geometry, model, place, policies, snapshot
from gpuplane.mig.geometry import HOPPER

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023"
FILES = ("default", "gpushare100")
POLICIES = ("gpuplane", "best-fit", "first-fit", "spread")
DURATION_CAP_S = 86_400.0
SAMPLES = 200

MAPPING = """\
Mapping of trace pods to requests (same for every policy):
  num_gpu == 0                      -> skipped (CPU only; count printed per file)
  num_gpu == 1, gpu_milli < 1000    -> one MIG instance, the smallest profile whose compute share covers
                                       gpu_milli/1000: 1g = 1/7, 2g = 2/7, 3g = 3/7, 4g = 4/7; above 4/7
                                       (no 5g/6g profile exists) -> one whole GPU (7g)
  num_gpu == 1, gpu_milli == 1000   -> one whole GPU
  num_gpu == n >= 2                 -> one tensor-parallel group of n GPUs inside one NVLink domain:
                                       HGX (8 GPUs/node, domain = node): 1 member x n GPUs;
                                       NVL72 (4 GPUs/node, 18 nodes/domain): n <= 4 -> 1 member x n,
                                       n = 8 -> gang of 2 members x 4 GPUs, tp_size 8
  GPU model constraints (gpu_spec) and CPU/memory are ignored: every GPU is an H100-class MIG GPU.
  Capacity units: a MIG instance counts its compute share (k/7 GPU), whole GPUs count 1."""

FRAG_DEF = """\
Fragmentation (after FGD, ATC '23): draw a request shape r from the file's own size mix (by count);
  its fragment is the free capacity (GPU units, free MIG compute slices as sevenths) that r could not
  use: for a MIG profile, free capacity on GPUs without a free placement of it; for a whole GPU, free
  capacity on partly used GPUs; for a TP group, all free capacity of domains that cannot host it, else
  partly used GPUs plus empty GPUs on nodes too small for a member. Reported: the expectation over the
  mix, time-averaged over 200 evenly spaced samples, in GPUs (and as % of free capacity).
Slivers = free capacity on partly used GPUs (GPU units). TP8 domains = domains able to take a TP8 group.
Wait = time from arrival to placement; requests still waiting at the end count with their wait so far."""


# --- trace -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pod:
    """One trace row."""

    name: str
    num_gpu: int
    milli: int
    created: float
    deleted: float


@dataclass(frozen=True, slots=True)
class Topology:
    """A fleet layout."""

    name: str
    domains: int
    nodes_per_domain: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        """GPUs in the fleet."""
        return self.domains * self.nodes_per_domain * self.gpus_per_node

    def nodes(self) -> int:
        """Nodes in the fleet."""
        return self.domains * self.nodes_per_domain


HGX = Topology("HGX 125x8", 125, 1, 8)
NVL72 = Topology("NVL72 14x72", 14, 18, 4)


def load_pods(path: Path) -> tuple[list[Pod], int]:
    """GPU pods in trace order (creation time, then row), and the number of CPU-only rows skipped."""
    pods: list[Pod] = []
    skipped = 0
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            n = int(row["num_gpu"])
            if n == 0:
                skipped += 1
                continue
            pods.append(
                Pod(row["name"], n, int(row["gpu_milli"]), float(row["creation_time"]), float(row["deletion_time"]))
            )
    pods.sort(key=lambda p: p.created)  # stable: ties keep file order
    return pods, skipped


def mig_profile_for(milli: int) -> str | None:
    """The smallest profile covering ``milli``/1000 of a GPU's compute, or None for a whole GPU."""
    k = max(1, -(-milli * 7 // 1000))
    return f"{k}g" if k <= 4 else None


def to_request(pod: Pod, rid: str, created: float, gpus_per_node: int) -> model.Request:
    """Map one pod to a request for a fleet with ``gpus_per_node`` GPUs per node."""
    if pod.num_gpu == 1:
        prof = mig_profile_for(pod.milli) if pod.milli < 1000 else None
        return model.Request(id=rid, mig_profile=prof, created=created)
    n = pod.num_gpu
    if n <= gpus_per_node:
        return model.Request(id=rid, gpus_per_member=n, tp_size=n, created=created)
    if n % gpus_per_node:
        raise ValueError(f"{pod.name}: {n} GPUs do not split into {gpus_per_node}-GPU members")
    return model.Request(id=rid, gpus_per_member=gpus_per_node, members=n // gpus_per_node, tp_size=n, created=created)


def units(r: model.Request) -> float:
    """Capacity a request takes, in GPU units (MIG: compute share)."""
    if r.mig_profile is not None:
        return int(r.mig_profile[0]) / 7
    return float(r.total_gpus)


# --- one replay --------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """Measurements of one replay."""

    placed: int = 0
    waiting_end: int = 0
    wait_mean: float = 0.0
    wait_p99: float = 0.0
    frag: float = 0.0
    frag_pct: float = 0.0
    slivers: float = 0.0
    tp8: float = 0.0
    gpu_waiting: float = 0.0  # % of samples with a one-GPU request in the queue (then no GPU is empty)
    util: float = 0.0
    crossings: int = 0
    lat_p50_us: float = 0.0
    lat_p99_us: float = 0.0
    decisions: int = 0
    dropped_prefill: int = 0  # warm-start pods that had to queue
    seconds: float = 0.0


@dataclass(slots=True)
class Workload:
    """Arrivals for one replay: requests with arrival times and durations, plus the warm-start population."""

    requests: list[model.Request]
    arrivals: list[float]
    durations: list[float]
    prefill: list[tuple[model.Request, float]] = field(default_factory=list)  # (request, residual duration)


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for an empty list)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


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
    policy: policies.base.Policy,
    work: Workload,
    mix: fragmentation.SizeMix,
    probe: Probe | None = None,
) -> Run:
    """Replay ``work`` on an empty ``topo`` fleet: FIFO queue with backfill, departures after each duration.

    ``probe``, if given, sees the snapshot and the running decisions at every sample time (analysis only).
    """
    t0 = time.perf_counter()
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
        policies.base.observe_queue(policy, queued)
        d = place.place(reqs[i], snap, policy)
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
                snap = snap.with_release(heapq.heappop(deps)[2])
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
    run.frag, run.frag_pct = fr, 100.0 * fr / free if free else 0.0
    run.slivers, run.tp8, run.util = sliv, tp8, 100.0 * used / topo.gpus
    run.gpu_waiting = 100.0 * gpu_waiting / SAMPLES
    run.decisions = len(lat)
    run.lat_p50_us = percentile(lat, 0.5) / 1000
    run.lat_p99_us = percentile(lat, 0.99) / 1000
    run.seconds = time.perf_counter() - t0
    return run


# --- workloads ---------------------------------------------------------------


def trace_time_workload(pods: Sequence[Pod], topo: Topology, limit: int | None) -> Workload:
    """Arrivals at the trace's creation times, durations deletion - creation."""
    use = pods[:limit] if limit else pods
    reqs = [to_request(p, f"p{i}", p.created, topo.gpus_per_node) for i, p in enumerate(use)]
    return Workload(reqs, [p.created for p in use], [max(0.0, p.deleted - p.created) for p in use])


def load_workload(pods: Sequence[Pod], topo: Topology, load: float, seed: int, limit: int | None) -> Workload:
    """Pods in trace order with Poisson arrivals at ``load`` x capacity; durations from the trace, capped.

    The fleet starts in the steady state of the same process: arrivals in the
    24 h before time 0 (pods taken cyclically backwards from the end of the
    trace) that are still running at 0 are placed first and not measured.
    """
    use = list(pods[:limit] if limit else pods)
    gn = topo.gpus_per_node
    proto = [to_request(p, f"p{i}", 0.0, gn) for i, p in enumerate(use)]
    durs = [min(DURATION_CAP_S, max(0.0, p.deleted - p.created)) for p in use]
    # Offered load: lambda * E[units * duration] / capacity, over the pods replayed.
    work_per_pod = statistics.fmean(units(r) * d for r, d in zip(proto, durs, strict=True))
    lam = load * topo.gpus / work_per_pod
    rng = random.Random(seed)
    t = 0.0
    arrivals = []
    reqs = []
    for r in proto:
        t += rng.expovariate(lam)
        arrivals.append(t)
        reqs.append(dataclasses.replace(r, created=t))
    prefill: list[tuple[float, model.Request, float]] = []
    back = 0.0
    k = len(use) - 1
    while True:
        back += rng.expovariate(lam)
        if back > DURATION_CAP_S:
            break
        if durs[k] > back:
            r = dataclasses.replace(proto[k], id=f"w{len(prefill)}", created=-back)
            prefill.append((-back, r, durs[k] - back))
        k = (k - 1) % len(use)
    prefill.sort(key=lambda x: x[0])
    return Workload(reqs, arrivals, durs, [(r, res) for _, r, res in prefill])


def size_mix(pods: Sequence[Pod], topo: Topology) -> fragmentation.SizeMix:
    """The file's own size mix, as request shapes for ``topo``."""
    return fragmentation.SizeMix.from_requests(to_request(p, "m", 0.0, topo.gpus_per_node) for p in pods)


# --- reporting ---------------------------------------------------------------

METRICS: tuple[tuple[str, str, Callable[[Run], float]], ...] = (
    ("requests placed", "{:.0f}", lambda r: r.placed),
    ("waiting at end", "{:.1f}", lambda r: r.waiting_end),
    ("mean wait (s)", "{:.0f}", lambda r: r.wait_mean),
    ("p99 wait (s)", "{:.0f}", lambda r: r.wait_p99),
    ("fragmentation (GPUs)", "{:.1f}", lambda r: r.frag),
    ("fragmentation (% free)", "{:.1f}", lambda r: r.frag_pct),
    ("slivers on partial GPUs", "{:.1f}", lambda r: r.slivers),
    ("TP8-capable domains", "{:.2f}", lambda r: r.tp8),
    ("samples with a 1-GPU waiting (%)", "{:.0f}", lambda r: r.gpu_waiting),
    ("utilisation (%)", "{:.1f}", lambda r: r.util),
    ("TP groups crossing domains", "{:.0f}", lambda r: r.crossings),
    ("decision p50 (us)", "{:.0f}", lambda r: r.lat_p50_us),
    ("decision p99 (us)", "{:.0f}", lambda r: r.lat_p99_us),
)


def mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def table(title: str, runs: dict[str, list[Run]]) -> list[str]:
    """One side-by-side table: metric rows, policy columns, mean ± sd over seeds."""
    names = [p for p in POLICIES if p in runs]
    width = 20
    lines = [title, f"{'metric':<28}" + "".join(f"{n:>{width}}" for n in names)]
    for label, fmt, get in METRICS:
        cells = []
        for n in names:
            m, sd = mean_sd([get(r) for r in runs[n]])
            cell = fmt.format(m) + (" ± " + fmt.format(sd) if len(runs[n]) > 1 else "")
            cells.append(f"{cell:>{width}}")
        lines.append(f"{label:<28}" + "".join(cells))
    return lines


@dataclass(slots=True)
class Check:
    """One target check."""

    what: str
    ok: bool
    detail: str


def avg(runs: list[Run], get: Callable[[Run], float]) -> float:
    """Mean of a metric over seeds."""
    return statistics.fmean(get(r) for r in runs)


def checks_for(scenario: str, topo: Topology, runs: dict[str, list[Run]]) -> list[Check]:
    """The issue's targets for one load scenario."""
    gp, bf, ff = runs["gpuplane"], runs["best-fit"], runs["first-fit"]
    out = [
        Check(
            f"{scenario}: zero TP crossings (all policies)",
            all(r.crossings == 0 for rs in runs.values() for r in rs),
            "crossings counted per decision",
        ),
    ]
    for label, get in (("mean wait", lambda r: r.wait_mean), ("waiting at end", lambda r: float(r.waiting_end))):
        g, b = avg(gp, get), avg(bf, get)
        ok = g <= b * 1.05 + 1e-9
        out.append(
            Check(f"{scenario}: {label} <= best-fit + 5%", ok, f"gpuplane {g:.1f} vs best-fit {b:.1f} ({_rel(g, b)})")
        )
    g, b, f = avg(gp, lambda r: r.frag), avg(bf, lambda r: r.frag), avg(ff, lambda r: r.frag)
    out.append(
        Check(
            f"{scenario}: fragmentation >= 5% below best-fit",
            g <= 0.95 * b,
            f"gpuplane {g:.1f} vs best-fit {b:.1f} GPUs ({_rel(g, b)})",
        )
    )
    out.append(
        Check(
            f"{scenario}: fragmentation >= 30% below first-fit",
            g <= 0.70 * f,
            f"gpuplane {g:.1f} vs first-fit {f:.1f} GPUs ({_rel(g, f)})",
        )
    )
    if topo is NVL72:
        g, b = avg(gp, lambda r: r.tp8), avg(bf, lambda r: r.tp8)
        detail = f"gpuplane {g:.2f} vs best-fit {b:.2f} ({_rel(g, b)})"
        if g == 0 and b == 0:
            # The replay is work-conserving: while a one-GPU request waits, no GPU is empty, so no domain
            # can take a TP8 group whatever the policy.
            wg, wb = avg(gp, lambda r: r.gpu_waiting), avg(bf, lambda r: r.gpu_waiting)
            detail += (
                f"; a 1-GPU request waited at {wg:.0f}% (gpuplane) / {wb:.0f}% (best-fit) of samples,"
                " and while one waits no GPU is empty"
            )
        out.append(Check(f"{scenario}: TP8-capable domains >= best-fit + 25%", g >= 1.25 * b and g > 0, detail))
    return out


def _rel(a: float, b: float) -> str:
    if b == 0:
        return "best-fit is 0" if a else "both 0"
    return f"{100.0 * (a - b) / b:+.1f}%"


# --- latency -----------------------------------------------------------------


def filled_cluster(
    nodes: int, topo: Topology, fill: float, seed: int, mix_reqs: Sequence[model.Request]
) -> snapshot.Snapshot:
    """``nodes`` nodes shaped like ``topo``, about ``fill`` of the GPUs used, built in one pass (seeded).

    A used GPU is whole or carries 1-3 MIG instances of profiles drawn from ``mix_reqs``.
    """
    rng = random.Random(seed)
    slots = geometry.slots_for(HOPPER)
    npd = topo.nodes_per_domain
    doms = []
    for i in range(max(1, nodes // npd)):
        dname = f"d{i}"
        node_list = []
        for j in range(npd):
            nname = f"{dname}-n{j}"
            gpus = []
            for k in range(topo.gpus_per_node):
                gid = f"{nname}-g{k}"
                if rng.random() >= fill:
                    gpus.append(model.Gpu(id=gid, node=nname, domain=dname))
                    continue
                r = mix_reqs[rng.randrange(len(mix_reqs))]
                if r.mig_profile is None:
                    gpus.append(model.Gpu(id=gid, node=nname, domain=dname, whole=True))
                    continue
                st, inst = geometry.EMPTY, []
                for _ in range(rng.randrange(1, 4)):
                    prof = mix_reqs[rng.randrange(len(mix_reqs))].mig_profile or "1g"
                    starts = slots.starts(st, prof)
                    if starts:
                        s = starts[rng.randrange(len(starts))]
                        st = slots.add(st, prof, s)
                        inst.append(model.MigInstance(prof, s))
                mig = tuple(sorted(inst, key=lambda x: (x.start, x.profile)))
                gpus.append(model.Gpu(id=gid, node=nname, domain=dname, mig=mig))
            node_list.append(model.Node(nname, dname, tuple(gpus)))
        doms.append(model.Domain(name=dname, nodes=tuple(node_list)))
    return snapshot.Snapshot.build(doms)


def latency_curve(
    pods: Sequence[Pod], topo: Topology, sizes: Sequence[int], decisions: int
) -> list[tuple[int, int, float, float, float]]:
    """(nodes, GPUs, p50 us, p99 us, decisions/s) for gpuplane on filled clusters; each decision is applied.

    Occupancy is held steady: after each decision a random earlier placement is released with probability 1/2.
    """
    reqs = [to_request(p, f"l{i}", 0.0, topo.gpus_per_node) for i, p in enumerate(pods)]
    mix = fragmentation.SizeMix.from_requests(reqs)
    out = []
    for nodes in sizes:
        snap = filled_cluster(nodes, topo, 0.7, 7, reqs)
        pol = policies.make("gpuplane", mix)
        lat: list[int] = []
        live: list[model.Decision] = []
        rng = random.Random(11)
        for i in range(decisions):
            r = reqs[i % len(reqs)]
            a = time.perf_counter_ns()
            d = place.place(r, snap, pol)
            lat.append(time.perf_counter_ns() - a)
            if d.placed:
                snap = snap.with_allocation(d)
                live.append(d)
            if live and rng.random() < 0.5:
                snap = snap.with_release(live.pop(rng.randrange(len(live))))
        n = sum(len(dm.nodes) for dm in snap.domains)
        out.append(
            (n, snap.gpu_total(), percentile(lat, 0.5) / 1000, percentile(lat, 0.99) / 1000, 1e9 * len(lat) / sum(lat))
        )
    return out


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
    args = ap.parse_args(argv)
    limit = 2500 if args.quick else None
    lat_decisions = 2000 if args.quick else 5000
    cmd = (
        "python -m bench.placement_bench"
        + (" --quick" if args.quick else "")
        + (f" --seeds {args.seeds}" if args.seeds != 5 else "")
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
    for fname in FILES:
        pods, skipped = load_pods(args.trace_dir / f"openb_pod_list_{fname}.csv")
        emit()
        emit(f"## {fname}: {len(pods)} GPU pods, {skipped} CPU-only pods skipped")
        for topo in (HGX, NVL72):
            mix = size_mix(pods, topo)
            emit(f"size mix on {topo.name}: " + ", ".join(f"{s.label()} {100 * w:.1f}%" for s, w in mix.shapes))
            if not args.skip_trace_time:
                work = trace_time_workload(pods, topo, limit)
                runs = {p: [replay(topo, policies.make(p, mix), work, mix)] for p in POLICIES}
                emit()
                for line in table(f"### {fname} / {topo.name} / trace time (one run, no queueing pressure)", runs):
                    emit(line)
            for load in (1.0, 1.2):
                runs = {p: [] for p in POLICIES}
                for seed in range(args.seeds):
                    work = load_workload(pods, topo, load, seed, limit)
                    for p in POLICIES:
                        runs[p].append(replay(topo, policies.make(p, mix), work, mix))
                emit()
                scen = f"{fname} / {topo.name} / load {load}"
                for line in table(f"### {scen} ({args.seeds} seeds)", runs):
                    emit(line)
                emit(
                    f"(prefill dropped: {avg(runs['gpuplane'], lambda r: r.dropped_prefill):.0f};"
                    f" wall {sum(r.seconds for rs in runs.values() for r in rs):.0f} s)"
                )
                all_checks.extend(checks_for(scen, topo, runs))
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
        write_docs(out)
    return 0


def write_docs(lines: list[str]) -> None:
    """Replace the results section of docs/placement.md with ``lines``."""
    path = REPO / "docs" / "placement.md"
    marker = "<!-- results -->"
    text = path.read_text() if path.exists() else f"# Placement\n\n{marker}\n"
    head = text.split(marker)[0]
    path.write_text(head + marker + "\n\n```text\n" + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    sys.exit(main())
