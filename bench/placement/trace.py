"""The Alibaba GPU trace (2023, "openb") as placement requests: pods, fleets, and the replayed workloads.

:func:`load_pods` reads a trace file; :func:`to_request` maps a pod to a placement request for a
fleet layout (:data:`HGX`, :data:`NVL72`; the mapping is :data:`MAPPING`); :func:`load_workload`
and :func:`trace_time_workload` build the arrivals one replay sees (seeded). Reads the trace files;
pure otherwise.
"""

from __future__ import annotations

import csv
import dataclasses
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuplane.placement import fragmentation, model

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023"
FILES = ("default", "gpushare100")
DURATION_CAP_S = 86_400.0

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


@dataclass(slots=True)
class Workload:
    """Arrivals for one replay: requests with arrival times and durations, plus the warm-start population."""

    requests: list[model.Request]
    arrivals: list[float]
    durations: list[float]
    prefill: list[tuple[model.Request, float]] = field(default_factory=list)  # (request, residual duration)
    sources: list[int] = field(default_factory=list)  # trace pod index of each request (prefill first), if known


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
    prefill: list[tuple[float, model.Request, float, int]] = []
    back = 0.0
    k = len(use) - 1
    while True:
        back += rng.expovariate(lam)
        if back > DURATION_CAP_S:
            break
        if durs[k] > back:
            r = dataclasses.replace(proto[k], id=f"w{len(prefill)}", created=-back)
            prefill.append((-back, r, durs[k] - back, k))
        k = (k - 1) % len(use)
    prefill.sort(key=lambda x: x[0])
    sources = [k for *_, k in prefill] + list(range(len(use)))
    return Workload(reqs, arrivals, durs, [(r, res) for _, r, res, _ in prefill], sources)


def size_mix(pods: Sequence[Pod], topo: Topology) -> fragmentation.SizeMix:
    """The file's own size mix, as request shapes for ``topo``."""
    return fragmentation.SizeMix.from_requests(to_request(p, "m", 0.0, topo.gpus_per_node) for p in pods)
