"""The right-sizing benchmark's pieces: the options a trace pod is offered, and the replay's MPS packing."""

from __future__ import annotations

from bench.placement.trace import HGX, Pod, load_workload
from bench.rightsize.rightsize_needs import Option, h100, need_of, options, soft_threshold
from bench.rightsize.rightsize_replay import Item, replay
from gpuplane.placement import model, snapshot
from gpuplane.placement.policies import make


def test_a_soft_pod_gets_an_mps_share_before_the_rounded_up_profile() -> None:
    gpu = h100()
    # 140 milli: 14 % of the SMs and of the memory (11.1Gi). 1g.10gb lacks the memory; 1g.20gb has
    # 19.6Gi and 26 of 132 SMs (the H100 transcript's count), so MIG rounds up to 1g.20gb, which
    # blocks 2 of 8 memory slices: 25 % of the GPU ("1g.2m" in the placement geometry).
    assert need_of(140, True, gpu).compute_percent == 14
    soft = options(140, True, "right-sized", gpu)
    assert [o.kind for o in soft] == ["MPS", "MIG", "GPU"]
    assert soft[0].share == 14 and soft[1].profile == "1g.2m"
    assert options(140, False, "right-sized", gpu) == (soft[1], soft[2])
    assert options(140, True, "fixed", gpu) == (soft[1],)
    # Above 4g's SMs (64 of 132 = 48 %) no MIG profile fits below a whole GPU.
    assert options(600, False, "fixed", gpu) == (Option("GPU", 1.0),)


def test_soft_threshold_splits_by_duration() -> None:
    durs = [float(d) for d in range(10)]
    assert sum(d < soft_threshold(durs, 0.5) for d in durs) == 5
    assert soft_threshold(durs, 0.0) < 0 and soft_threshold(durs, 1.0) == float("inf")


def test_replay_packs_mps_shares_and_frees_the_host_when_the_last_leaves() -> None:
    snap = snapshot.uniform_cluster(1, 1, 2)
    share = Option("MPS", 0.25, share=25)
    mig3 = Option("MIG", 0.5, profile="3g")
    items = [Item(model.Request(id=f"s{i}"), (share,), need=0.25) for i in range(4)]
    items += [Item(model.Request(id="whole")), Item(model.Request(id="m"), (mig3,), need=0.4)]
    items += [Item(model.Request(id="late"), (mig3,), need=0.4), Item(model.Request(id="end"))]
    arrivals = [1.0, 1.0, 1.0, 1.0, 2.0, 3.0, 4.0, 30.0]
    durations = [10.0, 10.0, 10.0, 10.0, 10.0, 5.0, 1.0, 1.0]
    res = replay(snap, make("best-fit"), items, arrivals, durations, npre=0)  # no stranding hold
    # Four 25 % shares fill one GPU, the whole-GPU request takes the other; the MIG requests wait
    # until the shares leave at t=11 and their host GPU is free again (8 s and 7 s).
    assert res.by_kind == {"MPS": 4, "MIG": 2}
    assert res.placed == 8 and res.waiting_end == 0
    assert abs(res.wait_mean - (8.0 + 7.0) / 8) < 1e-9


def test_workload_sources_name_the_trace_pod_of_every_request() -> None:
    pods = [Pod(f"p{i}", 1, 100 * (i % 9 + 1), float(i), float(i + 3600)) for i in range(200)]
    work = load_workload(pods, HGX, 1.0, 0, None)
    assert len(work.sources) == len(work.prefill) + len(work.requests)
    assert work.sources[len(work.prefill) :] == list(range(200))
    for (r, _), k in zip(work.prefill, work.sources, strict=False):
        assert r.mig_profile == next(q.mig_profile for q in work.requests if q.id == f"p{k}")
