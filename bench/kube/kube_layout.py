"""The real layout of a ``bench.kube.kube_replay`` record on the model's GPUs: what ``kube_compare`` compares.

Real (pool, device) names are mapped onto the model's GPU ids and MIG placements (nodes in the
replay's order); the claims' allocations and releases become a timeline, and the timeline the
cluster's layout at the placement benchmark's sample points, beside the model's open-loop replay
of the same workload (rebuilt from the record's metadata). Layout agreement is a multiset overlap
of GPU occupancy states (GPU positions are not compared). Pure but for reading the trace file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.placement import placement_bench as pb
from bench.placement import placement_deciders, placement_report, trace
from gpuplane.controller.node import snapshot_builder
from gpuplane.placement import fragmentation, geometry, model, snapshot


class Mapper:
    """Real (pool, device) names -> the model's GPU ids and placements (nodes by the replay's order)."""

    def __init__(self, slices: Sequence[Mapping[str, Any]], node_names: Sequence[str]) -> None:
        self.view = snapshot_builder.build_view(slices)
        self.index = {n: i for i, n in enumerate(node_names)}

    def gpu_id(self, real: str) -> str:
        node, dev = real.split("/", 1)
        return f"d{self.index[node]}-n0-g{dev.split('-')[1]}"

    def placement(self, devices: Sequence[Sequence[str]]) -> model.MemberPlacement | None:
        gpus: list[str] = []
        mig: list[model.MigSlot] = []
        node = ""
        for pool, dev in devices:
            key = f"{pool}/{dev}"
            node = pool
            if key in self.view.by_id:
                gpus.append(self.gpu_id(key))
            elif key in self.view.mig:
                info = self.view.mig[key]
                mig.append(model.MigSlot(self.gpu_id(info.parent), info.profile, info.start))
            else:
                return None
        if node not in self.index:
            return None
        name = f"d{self.index[node]}-n0"
        return model.MemberPlacement(0, name, f"d{self.index[node]}", gpus=tuple(gpus), mig=tuple(mig))


def states(snap: snapshot.Snapshot) -> Counter[int]:
    """Multiset of GPU occupancy states."""
    return Counter(snap.state(g) for g in snap.gpus())


def overlap(a: Counter[int], b: Counter[int]) -> tuple[float, float, float]:
    """Share of GPU states paired with an equal state on the other side: all GPUs, used GPUs, MIG GPUs.

    "Used" leaves empty GPUs out, "MIG" also whole ones: the layouts device choice decides.
    """
    total = max(sum(a.values()), 1)
    every = sum(min(a[k], b[k]) for k in a.keys() | b.keys()) / total

    def part(skip: tuple[int, ...]) -> float:
        ua = {k: v for k, v in a.items() if k not in skip}
        ub = {k: v for k, v in b.items() if k not in skip}
        size = max(sum(ua.values()), sum(ub.values()), 1)
        return sum(min(ua.get(k, 0), ub.get(k, 0)) for k in ua.keys() | ub.keys()) / size

    return every, part((geometry.EMPTY,)), part((geometry.EMPTY, geometry.WHOLE))


def rebuild(meta: Mapping[str, Any], trace_dir: Path) -> tuple[trace.Topology, trace.Workload, fragmentation.SizeMix]:
    """The workload the replay ran (same file, load, seed, claims, nodes)."""
    pods, _ = trace.load_pods(trace_dir / f"openb_pod_list_{meta['file']}.csv")
    topo = trace.Topology(f"HGX {meta['nodes']}x8", int(meta["nodes"]), 1, 8)
    work = trace.load_workload(pods, topo, float(meta["load"]), int(meta["seed"]), int(meta["claims"]))
    return topo, work, trace.size_mix(pods, topo)


def real_timeline(rec: Mapping[str, Any], mapper: Mapper) -> list[tuple[float, int, str, model.MemberPlacement]]:
    """(wall time, +1 allocate / -1 release, pod, placement), in time order."""
    out = []
    for c in rec["claims"].values():
        if c["allocated"] is None or c["pod"] not in rec["pods"]:
            continue
        mp = mapper.placement(c["devices"])
        if mp is None:
            continue
        out.append((c["allocated"], 1, c["pod"], mp))
        if c["gone"] is not None:
            out.append((c["gone"], -1, c["pod"], mp))
    out.sort(key=lambda e: (e[0], e[1]))
    return out


def real_samples(
    rec: Mapping[str, Any],
    topo: trace.Topology,
    timeline: Sequence[tuple[float, int, str, model.MemberPlacement]],
    end: float,
) -> list[snapshot.Snapshot]:
    """The real layout at the benchmark's sample times (trace seconds mapped to wall time)."""
    times = [rec["t0"] + end * (i + 0.5) / pb.SAMPLES / rec["compression"] for i in range(pb.SAMPLES)]
    snap = snapshot.uniform_cluster(topo.domains, topo.nodes_per_domain, topo.gpus_per_node)
    live: dict[str, model.Decision] = {}
    out = []
    k = 0
    for t in times:
        while k < len(timeline) and timeline[k][0] <= t:
            _, sign, pod, mp = timeline[k]
            k += 1
            try:
                if sign > 0 and pod not in live:
                    d = model.Decision(pod, (mp,))
                    snap = snap.with_allocation(d)
                    live[pod] = d
                elif sign < 0 and pod in live:
                    snap = snap.with_release(live.pop(pod))
            except ValueError:
                continue  # the two watches disagree for an instant: skip the event
        out.append(snap)
    return out


def model_samples(
    topo: trace.Topology, work: trace.Workload, mix: fragmentation.SizeMix, name: str
) -> tuple[list[snapshot.Snapshot], placement_report.Run]:
    """The model's layout at the same sample times (open loop: same arrivals, its own queue)."""
    got: list[snapshot.Snapshot] = []
    run = pb.replay(topo, placement_deciders.make_policy(name, mix, topo), work, mix, probe=lambda s, _d: got.append(s))
    return got, run


def mapper_node(rec: Mapping[str, Any], real: str) -> str:
    """The model's name of a real node (by the replay's node order)."""
    names = list(rec["nodes"])
    return f"d{names.index(real)}-n0" if real in names else ""


def utilisation(s: snapshot.Snapshot) -> float:
    """Share of the cluster's GPU units in use, in %."""
    free = sum(sum(d.signature) for d in s.domains) + sum(
        n * s.slots.free_units(st) for di in range(len(s.domains)) for st, n in s.state_counts(di).items()
    )
    return 100.0 * (1 - free / max(1, s.gpu_total()))
