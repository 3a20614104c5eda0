"""Where the default path's waiting goes at saturation: the steered column against counterfactuals, side by side.

Run ``python -m bench placement_waits --trace-dir DIR`` (default file, ``--quick`` size: the first 2,500
GPU pods, 5 seeds; about 90 s per scenario on a quiet machine). Columns, each on the same arrivals:

* today's default path and the fully steered one (as in :mod:`bench.placement.placement_bench`);
* steered without the stranding hold or taint, and gpuplane's own policy without the hold
  (is the hold what keeps requests waiting?);
* steered, never starting a TP8 group after the warm start (today's spread never finds an empty
  HGX node for one);
* both paths on the same offered work with every TP-n request split into n one-GPU requests (same
  arrival and duration): what today's waits are once it has to serve the TP work too.

Analysis only; nothing here is used by the plane.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bench.kube import kube_model
from bench.placement.placement_bench import replay
from bench.placement.placement_deciders import Decider, _walks, make_policy
from bench.placement.placement_report import STEERED, TODAY, Run
from bench.placement.trace import DEFAULT_TRACE, HGX, NVL72, Topology, Workload, load_pods, load_workload, size_mix
from gpuplane.placement import fragmentation, model, snapshot
from gpuplane.placement.policies import gpuplane


class NoNewTP8:
    """A placer that refuses every TP8 (or larger) request once the warm start is placed."""

    def __init__(self, inner: kube_model.KubeScheduler, warm_start: int) -> None:
        self.inner, self.warm_start, self.calls, self.name = inner, warm_start, 0, inner.name

    def place(self, request: model.Request, snap: snapshot.Snapshot) -> model.Decision:
        """Refuse TP8 after the warm start, else the inner placer's decision."""
        self.calls += 1
        if self.calls > self.warm_start and request.total_gpus >= 8:
            return model.Decision.refused(request.id, "counterfactual: no new TP8 group")
        return self.inner.place(request, snap)

    def allocated(self, d: model.Decision) -> None:
        """Pass on."""
        self.inner.allocated(d)

    def released(self, d: model.Decision) -> None:
        """Pass on."""
        self.inner.released(d)

    def observe_queue(self, waiting: Mapping[fragmentation.Shape, int]) -> None:
        """Pass on."""
        self.inner.observe_queue(waiting)


def split_tp(work: Workload) -> Workload:
    """The same offered work with every whole-GPU request of n GPUs as n one-GPU requests."""

    def one(r: model.Request) -> list[model.Request]:
        n = r.total_gpus if r.mig_profile is None else 1
        if n <= 1:
            return [r]
        return [dataclasses.replace(r, id=f"{r.id}.{k}", gpus_per_member=1, members=1, tp_size=1) for k in range(n)]

    reqs: list[model.Request] = []
    arr: list[float] = []
    dur: list[float] = []
    for r, a, d in zip(work.requests, work.arrivals, work.durations, strict=True):
        for x in one(r):
            reqs.append(x)
            arr.append(a)
            dur.append(d)
    return Workload(reqs, arr, dur, [(x, res) for r, res in work.prefill for x in one(r)])


Column = tuple[str, Callable[[Workload], Decider], bool]  # name, fresh decider for a workload, split TP


def columns(mix: fragmentation.SizeMix, topo: Topology) -> list[Column]:
    """The columns, in print order."""

    def unheld(_: Workload) -> Decider:
        k = kube_model.KubeScheduler(
            "steered, no hold",
            _walks(topo.gpus_per_node),
            mix,
            node_choice="gpuplane",
            device_order="preference",
            queue="scheduler",
        )
        k.controller = gpuplane.GpuPlane(mix, hold_stranding=False)
        return k

    def steered(_: Workload) -> Decider:
        return make_policy(STEERED, mix, topo)

    def no_tp8(w: Workload) -> Decider:
        inner = make_policy(STEERED, mix, topo)
        assert isinstance(inner, kube_model.KubeScheduler)
        return NoNewTP8(inner, len(w.prefill))

    return [
        ("kube-scheduler (today)", lambda _: make_policy(TODAY, mix, topo), False),
        ("steered", steered, False),
        ("steered, no hold, no taint", unheld, False),
        ("gpuplane, no hold", lambda _: gpuplane.GpuPlane(mix, hold_stranding=False), False),
        ("steered, never a new TP8", no_tp8, False),
        ("today, TP split to 1-GPU", lambda _: make_policy(TODAY, mix, topo), True),
        ("steered, TP split to 1-GPU", steered, True),
    ]


def _cell(xs: Sequence[float]) -> str:
    m = statistics.fmean(xs)
    return f"{m:.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{m:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--topologies", default="hgx", help="hgx and/or nvl72")
    ap.add_argument("--loads", default="1.2")
    args = ap.parse_args(argv)
    pods, _ = load_pods(args.trace_dir / "openb_pod_list_default.csv")
    for topo in ({"hgx": HGX, "nvl72": NVL72}[t] for t in args.topologies.split(",") if t):
        mix = size_mix(pods, topo)
        for load in (float(x) for x in args.loads.split(",") if x):
            t0 = time.perf_counter()
            cols = columns(mix, topo)
            runs: dict[str, list[Run]] = {name: [] for name, _, _ in cols}
            for seed in range(args.seeds):
                work = load_workload(pods, topo, load, seed, 2500)
                split = split_tp(work)
                for name, make, tp_split in cols:
                    w = split if tp_split else work
                    runs[name].append(replay(topo, make(w), w, mix))
            print(f"### default / {topo.name} / load {load} ({args.seeds} seeds, first 2500 GPU pods)")
            print(
                f"{'column':<30}"
                + "".join(
                    f"{h:>18}"
                    for h in (
                        "fragmentation",
                        "mean wait (s)",
                        "per GPU (s)",
                        "MIG (s)",
                        "whole (s)",
                        "placed",
                        "util (%)",
                    )
                )
            )
            for name, rs in runs.items():
                gets: list[Callable[[Run], float]] = [
                    lambda r: r.frag,
                    lambda r: r.wait_mean,
                    lambda r: r.wait_units,
                    lambda r: r.wait_mig,
                    lambda r: r.wait_whole,
                    lambda r: float(r.placed),
                    lambda r: r.util,
                ]
                print(f"{name:<30}" + "".join(f"{_cell([g(r) for r in rs]):>18}" for g in gets))
            print(f"(wall {time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
