"""Decision latency of the gpuplane policy on large filled clusters (the --skip-latency part of the benchmark).

:func:`filled_cluster` builds a seeded cluster about 70% used; :func:`latency_curve` times each
decision on it, applying each and releasing earlier ones to hold occupancy steady. Measures
wall time (``perf_counter_ns``); nothing else.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from bench.placement.placement_report import percentile
from bench.placement.trace import Pod, Topology, to_request
from gpuplane.mig.geometry import HOPPER
from gpuplane.placement import fragmentation, geometry, model, place, policies, snapshot


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
