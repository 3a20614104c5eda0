"""One replay of the trace with right-sizing: MIG profiles, MPS shares and whole GPUs on one fleet.

The queue is the placement benchmark's (FIFO with backfill, departures after each duration, the
same warm start). A request with several options (a GpuRequest's ``firstAvailable`` list) takes
the first option that fits anywhere in the fleet, as kube-scheduler does: it tries the options in
order on every node and scores nodes where an earlier one fits higher. Within an option:

* MIG and whole GPUs are placed by the given placement policy on the placement snapshot;
* an MPS share goes best-fit to the MPS-hosting GPU with the least room that still has the share
  (SMs and memory are shared out in proportion here, so one number, percent, covers both); with
  none, the policy picks an empty GPU, which then hosts MPS shares until its last one leaves. An
  MPS-hosting GPU is a whole-GPU allocation in the snapshot: no MIG instance and no exclusive
  claim can land on it, as the published counters enforce.

Measured, time-averaged over 200 evenly spaced samples, in GPUs: rounding waste (for running
fractional pods, what they hold beyond their need), capacity used, work served (the needs of the
pods running); and, per request, the wait from arrival to placement (still waiting at the end:
the wait so far). Single-threaded and seeded; pure apart from the clock it reads for its own
runtime.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.placement.placement_report import percentile
from bench.rightsize.rightsize_needs import Option
from gpuplane.placement import model, place, snapshot
from gpuplane.placement.policies import base

SAMPLES = 200


@dataclass(frozen=True, slots=True)
class Item:
    """One request of the replay: the fixed request (whole/multi-GPU), or the options of a fractional pod."""

    request: model.Request
    options: tuple[Option, ...] = ()  # empty: not fractional, place ``request`` as it is
    need: float = 0.0  # fractional pods: the pod's share of one GPU

    def key(self) -> tuple[object, ...]:
        """What two requests must share to fail to place the same way at one instant."""
        if not self.options:
            r = self.request
            return ("req", r.gpus_per_member, r.members, r.tp_size, r.mig_profile)
        return ("opt", *((o.kind, o.profile, o.share) for o in self.options))


@dataclass(slots=True)
class Result:
    """Measurements of one replay."""

    placed: int = 0
    waiting_end: int = 0
    wait_mean: float = 0.0
    wait_p99: float = 0.0
    waste: float = 0.0  # GPUs held beyond the need by fractional pods (time average)
    used: float = 0.0  # GPUs held (time average)
    served: float = 0.0  # GPUs of need running (time average)
    fractional_waiting: float = 0.0  # fractional requests waiting (time average)
    by_kind: dict[str, int] = field(default_factory=dict)  # fractional placements by option kind
    seconds: float = 0.0


@dataclass(slots=True)
class _Held:
    decision: model.Decision | None  # MIG / whole placement, or None for an MPS share
    gpu: str = ""  # MPS host
    share: int = 0
    held: float = 0.0
    need: float = 0.0


class _Fleet:
    """The placement snapshot plus the MPS hosts on it."""

    def __init__(self, snap: snapshot.Snapshot, policy: base.Policy) -> None:
        self.snap = snap
        self.policy = policy
        self.free_share: dict[str, int] = {}  # MPS host GPU -> percent still free
        self.host_decision: dict[str, model.Decision] = {}
        self.tenants: dict[str, int] = {}

    def try_option(self, rid: str, opt: Option) -> _Held | None:
        if opt.kind == "MPS":
            return self._mps(rid, opt)
        req = model.Request(id=rid, mig_profile=opt.profile) if opt.kind == "MIG" else model.Request(id=rid)
        d = place.place(req, self.snap, self.policy)
        if not d.placed:
            return None
        self.snap = self.snap.with_allocation(d)
        return _Held(d, held=opt.held)

    def try_request(self, r: model.Request) -> _Held | None:
        d = place.place(r, self.snap, self.policy)
        if not d.placed:
            return None
        self.snap = self.snap.with_allocation(d)
        return _Held(d, held=float(r.total_gpus))

    def _mps(self, rid: str, opt: Option) -> _Held | None:
        best: tuple[int, str] | None = None
        for gpu, free in self.free_share.items():
            if free >= opt.share and (best is None or (free, gpu) < best):
                best = (free, gpu)
        if best is None:
            d = place.place(model.Request(id=f"mps-host-{rid}"), self.snap, self.policy)
            if not d.placed:
                return None
            self.snap = self.snap.with_allocation(d)
            gpu = d.members[0].gpus[0]
            self.host_decision[gpu] = d
            self.free_share[gpu] = 100
            self.tenants[gpu] = 0
        else:
            gpu = best[1]
        self.free_share[gpu] -= opt.share
        self.tenants[gpu] += 1
        return _Held(None, gpu=gpu, share=opt.share, held=opt.held)

    def release(self, h: _Held) -> None:
        if h.decision is not None:
            self.snap = self.snap.with_release(h.decision)
            return
        self.free_share[h.gpu] += h.share
        self.tenants[h.gpu] -= 1
        if self.tenants[h.gpu] == 0:
            self.snap = self.snap.with_release(self.host_decision.pop(h.gpu))
            del self.free_share[h.gpu], self.tenants[h.gpu]


def replay(
    snap: snapshot.Snapshot,
    policy: base.Policy,
    items: Sequence[Item],
    arrivals: Sequence[float],
    durations: Sequence[float],
    *,
    npre: int,
) -> Result:
    """Replay ``items`` (the first ``npre`` are the warm start at time 0, not measured)."""
    t0 = time.perf_counter()
    fleet = _Fleet(snap, policy)
    res = Result()
    end = arrivals[-1]
    sample_at = [end * (i + 0.5) / SAMPLES for i in range(SAMPLES)]
    si = 0
    deps: list[tuple[float, int, int]] = []  # (time, seq, item index)
    held: dict[int, _Held] = {}
    started: dict[int, float] = {}
    waiting: dict[int, None] = {}
    failed: set[tuple[object, ...]] = set()
    acc = [0.0, 0.0, 0.0, 0.0]
    seq = 0

    def try_place(i: int, now: float) -> bool:
        nonlocal seq
        it = items[i]
        h: _Held | None = None
        if not it.options:
            h = fleet.try_request(it.request)
        else:
            for opt in it.options:
                h = fleet.try_option(it.request.id, opt)
                if h is not None:
                    h.need = it.need
                    if i >= npre:
                        res.by_kind[opt.kind] = res.by_kind.get(opt.kind, 0) + 1
                    break
        if h is None:
            failed.add(it.key())
            return False
        held[i] = h
        heapq.heappush(deps, (now + durations[i], seq, i))
        seq += 1
        started[i] = now
        return True

    def sample() -> None:
        waste = sum(h.held - h.need for h in held.values() if h.need)
        used = sum(h.held for h in held.values())
        served = sum(h.need if h.need else h.held for h in held.values())
        acc[0] += waste
        acc[1] += used
        acc[2] += served
        acc[3] += sum(1 for i in waiting if items[i].options)

    for i in range(npre):
        if not try_place(i, 0.0):
            waiting[i] = None
    ai, n = npre, len(items)
    while ai < n:
        t_arr = arrivals[ai]
        t_dep = deps[0][0] if deps else math.inf
        t = min(t_arr, t_dep)
        while si < SAMPLES and sample_at[si] < t:
            sample()
            si += 1
        if t_dep <= t_arr:
            while deps and deps[0][0] == t_dep:
                fleet.release(held.pop(heapq.heappop(deps)[2]))
            failed.clear()
            for i in list(waiting):
                if items[i].key() not in failed and try_place(i, t_dep):
                    del waiting[i]
        else:
            if items[ai].key() in failed or not try_place(ai, t_arr):
                waiting[ai] = None
            ai += 1
    while si < SAMPLES:
        sample()
        si += 1
    waits = [started[i] - arrivals[i] if i in started else end - arrivals[i] for i in range(npre, n)]
    res.placed = sum(1 for i in started if i >= npre)
    res.waiting_end = sum(1 for i in waiting if i >= npre)
    res.wait_mean = statistics.fmean(waits)
    res.wait_p99 = percentile(waits, 0.99)
    res.waste, res.used, res.served, res.fractional_waiting = (a / SAMPLES for a in acc)
    res.seconds = time.perf_counter() - t0
    return res
