"""How far each policy is from the best packing of what it runs: a lower bound on fragmentation.

At every sample time of a load replay, take the MIG instances actually running
and solve for the layout of them onto the GPUs not allocated whole that
minimises the per-GPU fragmentation term (an integer program over every valid
layout of one GPU, by instance counts; migration is free, so no online policy
can do better on that running set). Prints the time-averaged actual per-GPU
term, the bound, and the layouts at one sample side by side.

    python -m bench frag_bound default hgx 1.2 --seed 0

Needs scipy (in the dev extra). Analysis only: nothing here is used by gpuplane.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from bench.placement import placement_bench as pb
from bench.placement import trace
from gpuplane.placement import fragmentation, geometry, model, policies, snapshot

PROFILES = ("1g", "2g", "3g", "4g")
Counts = tuple[int, ...]


def layouts(slots: geometry.Slots) -> list[tuple[int, Counts]]:
    """Every valid GPU layout of PROFILES instances: (state, instance counts), empty excluded."""
    insts = [(p, s) for p in PROFILES for s in slots.profile(p).starts]
    out: list[tuple[int, Counts]] = []

    def dfs(k: int, state: int, counts: Counts) -> None:
        if any(counts):
            out.append((state, counts))
        for j in range(k, len(insts)):
            p, s = insts[j]
            if slots.fits(state, p, s):
                c = list(counts)
                c[PROFILES.index(p)] += 1
                dfs(j + 1, slots.add(state, p, s), tuple(c))

    dfs(0, geometry.EMPTY, (0,) * len(PROFILES))
    return out


class Bound:
    """Samples of (actual per-GPU fragmentation, lower bound) over one replay."""

    def __init__(self, frag: fragmentation.Fragmentation, gpus: int, show_at: int) -> None:
        self.frag = frag
        self.gpus = gpus
        self.show_at = show_at
        self.samples: list[tuple[float, float]] = []
        self.shown: list[str] = []
        cost: dict[Counts, tuple[float, int]] = {}
        for st, c in layouts(frag.slots):
            t = frag.gpu_term(st)
            if c not in cost or t < cost[c][0]:
                cost[c] = (t, st)
        self.vectors = list(cost)
        self.cost = np.array([cost[v][0] for v in self.vectors])
        self.matrix = np.array(self.vectors).T

    def __call__(self, snap: snapshot.Snapshot, running: Sequence[model.Decision]) -> None:
        n = collections.Counter(s.profile for d in running for m in d.members for s in m.mig)
        need = np.array([n[p] for p in PROFILES])
        whole = actual = 0.0
        layout: collections.Counter[str] = collections.Counter()
        for di in range(len(snap.domains)):
            for st, k in snap.state_counts(di).items():
                if st == geometry.WHOLE:
                    whole += k
                elif st != geometry.EMPTY:
                    actual += k * self.frag.gpu_term(st)
                    layout[_describe(snap, di, st)] += k
        res = milp(
            self.cost,
            constraints=[
                LinearConstraint(self.matrix, need, need),
                LinearConstraint(np.ones((1, len(self.vectors))), 0, self.gpus - whole),
            ],
            integrality=np.ones(len(self.vectors)),
            bounds=Bounds(0, np.inf),
            options={"time_limit": 10},
        )
        if res.status == 0:
            bound = float(res.fun)
        elif res.mip_dual_bound is not None:
            bound = float(res.mip_dual_bound)  # not proven optimal in time: the dual bound is still a bound
        else:
            raise RuntimeError(f"milp failed at a sample: {res.message}")
        self.samples.append((actual, bound))
        if len(self.samples) == self.show_at and res.x is not None:
            best = {self.vectors[i]: round(float(x)) for i, x in enumerate(res.x) if x > 0.5}
            ranked = sorted(best.items(), key=lambda kv: -kv[1])
            self.shown = [
                f"  running: {dict(n)}; actual {actual:.2f}, bound {bound:.2f}",
                "  actual layouts: " + ", ".join(f"{k} x{v}" for k, v in layout.most_common()),
                "  bound layouts:  " + ", ".join(f"{_counts(c)} x{v}" for c, v in ranked),
            ]


def _counts(c: Counts) -> str:
    return "+".join(f"{k}x{p}" if k > 1 else p for p, k in zip(PROFILES, c, strict=True) if k)


def _describe(snap: snapshot.Snapshot, di: int, state: int) -> str:
    for node in snap.domains[di].nodes:
        for g in node.gpus:
            if g.mig and not g.whole and snap.slots.state_of(False, g.mig) == state:
                return "+".join(f"{i.profile}@{i.start}" for i in sorted(g.mig, key=lambda i: i.start))
    return f"{state:#x}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("file", choices=trace.FILES)
    ap.add_argument("fleet", choices=("hgx", "nvl72"))
    ap.add_argument("load", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default="gpuplane,best-fit,first-fit")
    ap.add_argument("--trace-dir", type=Path, default=trace.DEFAULT_TRACE)
    args = ap.parse_args(argv)

    topo = trace.HGX if args.fleet == "hgx" else trace.NVL72
    pods, _ = trace.load_pods(args.trace_dir / f"openb_pod_list_{args.file}.csv")
    mix = trace.size_mix(pods, topo)
    print(f"# {args.file} / {topo.name} / load {args.load} / seed {args.seed}: per-GPU fragmentation (GPUs)")
    print(f"{'policy':<10}{'actual':>9}{'bound':>9}{'avoidable':>11}")
    shown = []
    for name in args.policies.split(","):
        work = trace.load_workload(pods, topo, args.load, args.seed, None)
        frag = fragmentation.Fragmentation(mix, snapshot.uniform_cluster(1, 1, 1).slots)
        probe = Bound(frag, topo.gpus, show_at=pb.SAMPLES // 2)
        pb.replay(topo, policies.make(name, mix), work, mix, probe=probe)
        a = statistics.fmean(x for x, _ in probe.samples)
        b = statistics.fmean(y for _, y in probe.samples)
        print(f"{name:<10}{a:9.2f}{b:9.2f}{100 * (a - b) / a if a else 0:10.1f}%", flush=True)
        shown += [f"{name}, sample {probe.show_at}:", *probe.shown]
    print("\n".join(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
