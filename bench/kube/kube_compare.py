"""The real scheduler's allocations (bench.kube.kube_replay records) against the kube-scheduler model.

    python -m bench kube_compare [--out DIR] [--write-docs]

For each recorded mode (``today``: the default path; ``steered``: gate-and-steer plus the
steered slices) it rebuilds the same workload, then compares:

* **At the same sample points** (200, evenly spaced over the arrivals, the placement benchmark's
  samples): the real layout (every allocated claim, mapped onto GPU occupancy states) against the
  model's open-loop replay of the same arrivals. Layout agreement = the share of GPUs whose
  occupancy state (empty, whole, or the exact set of MIG instances) can be paired with an equal
  state on the other side (multiset overlap; GPU positions are not compared, since the scheduler
  breaks score ties in the order its parallel filter finds nodes). Fragmentation of each, by the
  benchmark's measure and the file's own mix; the same agreement against gpuplane's and
  first-fit's replays, as a yardstick.
* **Decision by decision**: before each real allocation, the cluster as the records show it then;
  what the model decides there (node: the highest LeastAllocated score, ties listed; device: the
  walk on the node the scheduler chose) against what the scheduler did.
* Waiting (bound - arrival, trace s), slice writes (driver counters, apiserver requests), gate time.

The record's layout on the model's GPUs (names mapped, timeline, samples) is ``bench.kube.kube_layout``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.kube import kube_model
from bench.kube.kube_layout import (
    Mapper,
    mapper_node,
    model_samples,
    overlap,
    real_samples,
    real_timeline,
    rebuild,
    states,
    utilisation,
)
from bench.placement import placement_report, trace
from gpuplane.mig.geometry import HOPPER
from gpuplane.placement import fragmentation, geometry, model, place, preference, snapshot
from gpuplane.placement.policies import gpuplane

REPO = Path(__file__).resolve().parents[2]


def one_step(
    rec: Mapping[str, Any],
    reqs: Sequence[model.Request],
    topo: trace.Topology,
    mix: fragmentation.SizeMix,
    timeline: Sequence[tuple[float, int, str, model.MemberPlacement]],
    *,
    steered: bool,
) -> dict[str, float]:
    """Per real allocation: does the model pick the same node (or tie with it), and the same device there?"""
    walks = kube_model.walks_for([8])
    ks = kube_model.KubeScheduler("probe", walks, mix)
    ctl = gpuplane.GpuPlane(mix)
    drv = gpuplane.GpuPlane(mix, hold_stranding=False)
    withheld = preference.hopper_stranding() if steered else frozenset()
    snap = snapshot.uniform_cluster(topo.domains, topo.nodes_per_domain, topo.gpus_per_node)
    live: dict[str, model.Decision] = {}
    n = tied = exact = dev_n = dev_same = skipped = steered_n = followed = 0
    for _, sign, pod, mp in timeline:
        if sign < 0:
            if pod in live:
                d = live.pop(pod)
                snap = snap.with_release(d)
                ks.released(d)
            continue
        req = reqs[rec["pods"][pod]["index"]]
        if req.members != 1 or pod in live:
            continue
        n += 1
        aff = rec["pods"][pod].get("affinity_node") or ""
        if steered and aff:
            # Steered: the model is the controller's choice on this state (then the driver's order).
            steered_n += 1
            followed += mapper_node(rec, aff) == mp.node
            d = place.place(req, snap, ctl)
            picks = {d.members[0].node} if d.placed else set()
            first = d.members[0].node if d.placed else ""
        else:
            # The default path (or a pod the controller released): the scheduler's own choice.
            picks, first = ks.best_nodes(req, snap)
        tied += mp.node in picks
        exact += mp.node == first
        di = int(mp.node[1:].split("-")[0])
        node = snap.domains[di].nodes[0]
        if req.mig_profile is not None:
            slots = snap.slots
            st = tuple(slots.state_of(g.whole, g.mig) for g in node.gpus)
            if steered:
                want = preference.best_on_node(drv, slots, st, req.mig_profile, withheld)
            else:
                want = next(
                    (
                        (k, s)
                        for k, s in walks[8].mig.get(req.mig_profile, ())
                        if st[k] != geometry.WHOLE and slots.fits(st[k], req.mig_profile, s)
                    ),
                    None,
                )
            dev_n += 1
            got = (int(mp.mig[0].gpu.rsplit("-g", 1)[1]), mp.mig[0].start)
            dev_same += want == got
        try:
            d = model.Decision(pod, (mp,))
            snap = snap.with_allocation(d)
            ks.allocated(d)
            live[pod] = d
        except ValueError:
            skipped += 1
    extra = {}
    if steered:
        extra = {"steered pods": steered_n, "bound where steered (%)": 100 * followed / max(steered_n, 1)}
    return {
        "decisions": n,
        "node in model's best set (%)": 100 * tied / max(n, 1),
        "node = model's pick (%)": 100 * exact / max(n, 1),
        "MIG device = model's on that node (%)": 100 * dev_same / max(dev_n, 1),
        "MIG decisions": dev_n,
        "inconsistent events skipped": skipped,
        **extra,
    }


def waits(rec: Mapping[str, Any]) -> dict[str, float]:
    """Wait (bound - arrival) of the measured pods, in trace seconds; unbound ones count until the end."""
    c = rec["compression"]
    ws = []
    for p in rec["pods"].values():
        if p["prefill"]:
            continue
        t = p["bound"] if p["bound"] is not None else rec["end"]
        ws.append(max(0.0, t - p["arrival"]) * c)
    gated = [p["ungated"] - p["created"] for p in rec["pods"].values() if p["gated"] and p["ungated"] and p["created"]]
    out = {"mean wait (trace s)": statistics.fmean(ws), "bound": sum(1 for p in rec["pods"].values() if p["bound"])}
    if gated:
        gs = sorted(gated)
        out["gated pods"] = len(gs)
        out["gate time p50 (ms)"] = 1000 * gs[len(gs) // 2]
        out["gate time p99 (ms)"] = 1000 * gs[min(len(gs) - 1, int(0.99 * len(gs)))]
    return out


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")  # apiserver_request_total verbs that write


def writes(rec: Mapping[str, Any]) -> dict[str, float]:
    """Slice writes per second over the replay: the drivers' counters and the apiserver's requests."""
    span = rec["end"] - rec["t0"]
    before, after = rec["slice_writes"]["before"], rec["slice_writes"]["after"]
    total: Counter[str] = Counter()
    for node, verbs in after.items():
        for verb, v in verbs.items():
            total[verb] += v - before.get(node, {}).get(verb, 0.0)
    a0, a1 = rec["apiserver_slices"]["before"], rec["apiserver_slices"]["after"]
    api = {k: a1.get(k, 0.0) - a0.get(k, 0.0) for k in a1}
    return {
        **{f"driver {k} writes/s": v / span for k, v in sorted(total.items())},
        "driver writes/s per node": sum(total.values()) / span / max(1, len(after)),
        **{f"apiserver {k}/s": v / span for k, v in sorted(api.items()) if k in WRITE_VERBS},
    }


def compare(rec: Mapping[str, Any], trace_dir: Path) -> list[str]:
    """The report for one recorded mode."""
    steered = rec["mode"] == "steered"
    topo, work, mix = rebuild(rec["meta"], trace_dir)
    reqs = [r for r, _ in work.prefill] + list(work.requests)
    mapper = Mapper(rec["slices"], rec["nodes"])
    timeline = real_timeline(rec, mapper)
    end = work.arrivals[-1]
    real = real_samples(rec, topo, timeline, end)
    frag = fragmentation.Fragmentation(mix, geometry.slots_for(HOPPER))
    ours = placement_report.STEERED if steered else placement_report.TODAY
    lines = [
        f"### {rec['mode']}: {len(reqs)} pods on {topo.name}, load {rec['meta']['load']}, seed {rec['meta']['seed']}"
    ]
    head = (
        "layout: all GPUs",
        "used GPUs",
        "MIG GPUs",
        "frag real",
        "frag model",
        "|diff|",
        "util real",
        "util model",
        "wait model",
    )
    lines.append(f"{'compared with':36}" + "".join(f"{h:>{len(h) + 2}}" for h in head))
    for name in (ours, "gpuplane", "first-fit", "spread"):
        snaps, run = model_samples(topo, work, mix, name)
        ov = [overlap(states(a), states(b)) for a, b in zip(real, snaps, strict=True)]
        fr_s = [frag.of(s) for s in real]
        fm_s = [frag.of(s) for s in snaps]
        diff = statistics.fmean(abs(x - y) for x, y in zip(fr_s, fm_s, strict=True))
        ur = statistics.fmean(utilisation(s) for s in real)
        um = statistics.fmean(utilisation(s) for s in snaps)
        vals = [f"{100 * statistics.fmean(o[k] for o in ov):.1f}%" for k in range(3)]
        vals += [f"{statistics.fmean(fr_s):.2f}", f"{statistics.fmean(fm_s):.2f}", f"{diff:.2f}"]
        vals += [f"{ur:.1f}%", f"{um:.1f}%", f"{run.wait_mean:.0f}"]
        lines.append(f"{name:36}" + "".join(f"{v:>{len(h) + 2}}" for v, h in zip(vals, head, strict=True)))
    lines.append(
        "decision by decision: "
        + json.dumps({k: round(v, 1) for k, v in one_step(rec, reqs, topo, mix, timeline, steered=steered).items()})
    )
    lines.append("real waiting and gate: " + json.dumps({k: round(v, 1) for k, v in waits(rec).items()}))
    lines.append("slice writes: " + json.dumps({k: round(v, 3) for k, v in writes(rec).items()}))
    return lines


def side_by_side(recs: Mapping[str, Mapping[str, Any]], trace_dir: Path) -> list[str]:
    """The real runs next to each other: what the real allocations did, steered against not."""
    rows: dict[str, list[str]] = {}
    for mode, rec in recs.items():
        topo, work, mix = rebuild(rec["meta"], trace_dir)
        mapper = Mapper(rec["slices"], rec["nodes"])
        real = real_samples(rec, topo, real_timeline(rec, mapper), work.arrivals[-1])
        frag = fragmentation.Fragmentation(mix, geometry.slots_for(HOPPER))
        w = waits(rec)
        pods = [p for p in rec["pods"].values() if not p["prefill"]]
        wall = [max(0.0, (p["bound"] if p["bound"] is not None else rec["end"]) - p["arrival"]) for p in pods]
        sw = writes(rec)
        rows[mode] = [
            f"{statistics.fmean(frag.of(s) for s in real):.2f}",
            f"{statistics.fmean(utilisation(s) for s in real):.1f}",
            f"{sum(1 for p in pods if p['bound'] is not None)}/{len(pods)}",
            f"{w['mean wait (trace s)']:.0f}",
            f"{statistics.fmean(wall):.1f}",
            f"{w.get('gate time p50 (ms)', 0):.0f} / {w.get('gate time p99 (ms)', 0):.0f}",
            f"{sw.get('driver writes/s per node', 0.0):.2f}",
            f"{sum(v for k, v in sw.items() if k.startswith('apiserver')):.2f}",
        ]
    labels = (
        "fragmentation (GPUs, time-averaged)",
        "utilisation (%)",
        "requests bound",
        "mean wait (trace s)",
        "mean wait (wall s)",
        "time gated p50 / p99 (ms)",
        "slice writes /s per node (driver)",
        "ResourceSlice writes /s (apiserver)",
    )
    out = ["### real allocations, steered against the default path (same arrivals)"]
    out.append(f"{'':38}" + "".join(f"{m:>16}" for m in rows))
    for i, label in enumerate(labels):
        out.append(f"{label:38}" + "".join(f"{rows[m][i]:>16}" for m in rows))
    return out


def _p50_ms(xs: Sequence[float]) -> str:
    return f"{1000 * placement_report.percentile(xs, 0.5):.0f}" if xs else "-"


def added_latency(recs: Mapping[str, Mapping[str, Any]], within_s: float = 1.0) -> list[str]:
    """Creation to bound for the pods that waited for no capacity in any mode (bound within ``within_s``
    of creation in every record), and, where a pod was gated, its two parts: creation to gate lifted,
    gate lifted to bound (the recorder's watch times)."""
    fast: set[str] | None = None
    for rec in recs.values():
        quick = {
            n
            for n, p in rec["pods"].items()
            if p["created"] is not None and p["bound"] is not None and p["bound"] - p["created"] <= within_s
        }
        fast = quick if fast is None else fast & quick
    names = sorted(fast or ())
    out = [
        f"### creation -> bound, the {len(names)} pods bound within {within_s:g} s of creation in every mode (p50, ms)"
    ]
    for mode, rec in recs.items():
        pods = [rec["pods"][n] for n in names]
        line = f"{mode:>10}: creation -> bound {_p50_ms([p['bound'] - p['created'] for p in pods])}"
        gated = [p for p in pods if p["gated"] and p["ungated"] is not None]
        if gated:
            line += (
                f" = creation -> gate lifted {_p50_ms([p['ungated'] - p['created'] for p in gated])}"
                f" + gate lifted -> bound {_p50_ms([p['bound'] - p['ungated'] for p in gated])}"
                f" ({len(gated)} gated)"
            )
        out.append(line)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=Path("/tmp/kube-replay"))
    ap.add_argument("--trace-dir", type=Path, default=trace.DEFAULT_TRACE)
    args = ap.parse_args(argv)
    recs = {}
    for mode in ("today", "steered"):
        path = args.out / f"{mode}.json"
        if path.is_file():
            recs[mode] = json.loads(path.read_text())
            for line in compare(recs[mode], args.trace_dir):
                print(line, flush=True)
    if len(recs) > 1:
        for line in [*side_by_side(recs, args.trace_dir), *added_latency(recs)]:
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
