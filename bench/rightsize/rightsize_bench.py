"""Right-sizing on the Alibaba GPU trace (2023, "openb"): fixed MIG profiles against GpuRequests.

``python -m bench rightsize_bench [--quick] [--seeds 5] [--write-docs]``

For each trace file and load, the same arrivals (the placement benchmark's Poisson load replay,
seeded, warm start included) are replayed with:

* ``fixed``: every fractional pod asks for the smallest MIG profile that meets its need;
* ``soft 50% shortest``: GpuRequests; the shorter half of the fractional pods (inference-like) are
  soft, their list puts an MPS share of exactly the need before a profile that would round it up;
  the rest are hard (that profile, then a whole GPU);
* ``soft 50% random``: the same with a seeded coin deciding which half is soft;
* ``soft 100%``: every fractional pod soft.

(A GpuRequest with every pod hard, i.e. the profile and then a whole GPU, replayed exactly as
``fixed`` in a quick run: a whole GPU is free only when a MIG profile fits too.)

Reported per variant (mean ± sd over the seeds): MIG rounding waste (GPUs held beyond the need
by fractional pods, time-averaged, % of the fleet), the fleet share recovered from it against
``fixed`` (percentage points), capacity used and need served (% of the fleet), mean and p99 wait,
requests still waiting at the end, and how fractional pods were held. Cite Weng et al., "Beware
of Fragmentation", USENIX ATC '23, when quoting results on this trace.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import docs_results
from bench.placement.trace import DEFAULT_TRACE, HGX, REPO, Topology, load_pods, load_workload, size_mix
from bench.rightsize.rightsize_needs import Option, Variant, h100, options, soft_threshold
from bench.rightsize.rightsize_replay import Item, Result, replay
from gpuplane.placement import model, snapshot
from gpuplane.placement.policies import make as make_policy

FILES = ("default", "gpushare100")
LOADS = (1.0, 1.2)
VARIANTS = ("fixed", "soft 50% shortest", "soft 50% random", "soft 100%")


def items_for(
    work_requests: Sequence[model.Request],
    sources: Sequence[int],
    milli: Sequence[int],
    *,
    variant: Variant,
    soft: Callable[[int], bool],
) -> list[Item]:
    """The replay items for one variant: fractional pods get options, the rest stay as they are."""
    gpu = h100()
    cache: dict[tuple[int, bool], tuple[Option, ...]] = {}
    out: list[Item] = []
    for r, k in zip(work_requests, sources, strict=True):
        m = milli[k]
        if r.mig_profile is None and not (r.total_gpus == 1 and m < 1000):
            out.append(Item(r))
            continue
        is_soft = soft(k)
        key = (m, is_soft)
        if key not in cache:
            cache[key] = options(m, is_soft, variant, gpu)
        out.append(Item(r, cache[key], need=m / 1000))
    return out


def _softness(durs: Sequence[float], short: float, heads: Sequence[bool]) -> dict[str, Callable[[int], bool]]:
    """Which pods (by trace index) are soft, per variant."""

    def never(k: int) -> bool:
        return False

    def shorter(k: int) -> bool:
        return durs[k] < short

    def coin(k: int) -> bool:
        return heads[k]

    def always(k: int) -> bool:
        return True

    return dict(zip(VARIANTS, (never, shorter, coin, always), strict=True))


def mean_sd(xs: Sequence[float]) -> str:
    """``mean ± sd`` of a short list."""
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.fmean(xs):.2f} ± {statistics.stdev(xs):.2f}"


def table(topo: Topology, rows: dict[str, list[Result]]) -> list[str]:
    """The variants of one scenario, side by side."""
    fleet = topo.gpus
    base = rows["fixed"]
    head = (
        f"{'variant':<26}{'waste %fleet':>16}{'recovered pp':>16}{'used %':>14}{'served %':>14}"
        f"{'wait mean s':>18}{'wait p99 s':>20}{'waiting':>10}  fractional pods held as"
    )
    lines = [head]
    for name, runs in rows.items():

        def pct(get: Callable[[Result], float], rs: list[Result] = runs) -> list[float]:
            return [100 * get(r) / fleet for r in rs]

        recovered = [100 * (b.waste - r.waste) / fleet for b, r in zip(base, runs, strict=True)]
        kinds: dict[str, int] = {}
        for r in runs:
            for k, v in r.by_kind.items():
                kinds[k] = kinds.get(k, 0) + v
        total = sum(kinds.values()) or 1
        held = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(kinds.items()))
        lines.append(
            f"{name:<26}{mean_sd(pct(lambda r: r.waste)):>16}{mean_sd(recovered):>16}"
            f"{mean_sd(pct(lambda r: r.used)):>14}{mean_sd(pct(lambda r: r.served)):>14}"
            f"{mean_sd([r.wait_mean for r in runs]):>18}{mean_sd([r.wait_p99 for r in runs]):>20}"
            f"{statistics.fmean(r.waiting_end for r in runs):>10.0f}  {held}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first 2500 GPU pods of each file")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--policy", default="gpuplane", help="placement policy for MIG and whole GPUs")
    ap.add_argument("--write-docs", action="store_true", help="write the report into docs/rightsizing.md")
    args = ap.parse_args(argv)
    limit = 2500 if args.quick else None
    topo = HGX
    out: list[str] = []

    def emit(line: str = "") -> None:
        out.append(line)
        print(line, flush=True)

    cmd = (
        "python -m bench rightsize_bench"
        + (" --quick" if args.quick else "")
        + (f" --seeds {args.seeds}" if args.seeds != 5 else "")
    )
    emit(f"# gpuplane right-sizing benchmark ({cmd})")
    emit(
        f"Fleet {topo.name} of {h100().product}; policy {args.policy} for MIG and whole GPUs, MPS shares"
        " best-fit; Poisson arrivals at load x capacity (the placement benchmark's replay, same arrivals for"
        f" every variant), {args.seeds} seeds, mean ± sd." + (f" --quick: first {limit} GPU pods." if limit else "")
    )
    t_start = time.perf_counter()
    for fname in FILES:
        pods, _ = load_pods(args.trace_dir / f"openb_pod_list_{fname}.csv")
        use = pods[:limit] if limit else pods
        milli = [p.milli if p.num_gpu == 1 else 1000 for p in use]
        durs = [max(0.0, p.deleted - p.created) for p in use]
        frac = [d for d, m in zip(durs, milli, strict=True) if m < 1000]
        emit()
        emit(
            f"## {fname}: {len(use)} GPU pods, {len(frac)} fractional ({100 * len(frac) / len(use):.0f}%);"
            f" the shorter half ran under {soft_threshold(frac, 0.5):.0f} s"
        )
        mix = size_mix(pods, topo)
        for load in LOADS:
            short = soft_threshold(frac, 0.5)
            rows: dict[str, list[Result]] = {name: [] for name in VARIANTS}
            for seed in range(args.seeds):
                work = load_workload(pods, topo, load, seed, limit)
                reqs = [r for r, _ in work.prefill] + work.requests
                arr = [0.0] * len(work.prefill) + work.arrivals
                dur = [res for _, res in work.prefill] + work.durations
                coin = random.Random(10_000 + seed)
                heads = [coin.random() < 0.5 for _ in use]
                softness = _softness(durs, short, heads)
                for name in VARIANTS:
                    variant: Variant = "fixed" if name == VARIANTS[0] else "right-sized"
                    items = items_for(reqs, work.sources, milli, variant=variant, soft=softness[name])
                    snap = snapshot.uniform_cluster(topo.domains, topo.nodes_per_domain, topo.gpus_per_node)
                    rows[name].append(
                        replay(snap, make_policy(args.policy, mix), items, arr, dur, npre=len(work.prefill))
                    )
            emit()
            emit(f"### {fname} / {topo.name} / load {load} ({args.seeds} seeds)")
            for line in table(topo, rows):
                emit(line)
            emit(f"(wall {sum(r.seconds for rs in rows.values() for r in rs):.0f} s)")
    emit()
    emit(f"total wall {time.perf_counter() - t_start:.0f} s")
    if args.write_docs:
        docs_results.write(REPO / "docs" / "rightsizing.md", "Right-sizing", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
