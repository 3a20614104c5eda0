"""The placement benchmark's wait accounting: warm-start requests that had to queue, and waits by shape."""

from __future__ import annotations

from bench.placement.placement_bench import replay
from bench.placement.placement_report import Run, shape_table
from bench.placement.trace import Topology, Workload
from gpuplane.placement import fragmentation, model
from gpuplane.placement.policies import make

ONE_GPU = Topology("one GPU", 1, 1, 1)


def _one_gpu_replay() -> Run:
    # One GPU. Warm start: A runs (10 s left), B does not fit and queues at time 0. Then C arrives at 5
    # (1 s), D at 30 (1 s). A leaves at 10: B starts (waited 10 s from 0); B leaves at 20: C starts
    # (waited 15 s); C leaves at 21; D starts on arrival.
    req = [model.Request(id=x) for x in "ABCD"]
    work = Workload(
        requests=req[2:], arrivals=[5.0, 30.0], durations=[1.0, 1.0], prefill=[(req[0], 10.0), (req[1], 10.0)]
    )
    mix = fragmentation.SizeMix.from_counts({fragmentation.Shape(): 1})
    return replay(ONE_GPU, make("first-fit", mix), work, mix)


def test_warm_start_that_queued_counts_in_the_incl_waits_only() -> None:
    run = _one_gpu_replay()
    assert run.dropped_prefill == 1
    assert run.wait_mean == 7.5  # C 15 s, D 0 s: the measured requests only
    assert run.wait_all == (15.0 + 0.0 + 10.0) / 3  # + B, waiting from 0
    assert run.wait_all_units == run.wait_all  # every request asks one GPU
    assert run.prefill_waiting_end == 0
    assert run.by_shape == {"1gpu": (2, 2, 7.5)}


def test_warm_start_never_placed_is_counted_waiting_to_the_end() -> None:
    # B's 10 s residual outlasts the replay (ends at C's arrival, 5 s): B waits from 0 to the end.
    req = [model.Request(id=x) for x in "ABC"]
    work = Workload(requests=[req[2]], arrivals=[5.0], durations=[1.0], prefill=[(req[0], 10.0), (req[1], 10.0)])
    mix = fragmentation.SizeMix.from_counts({fragmentation.Shape(): 1})
    run = replay(ONE_GPU, make("first-fit", mix), work, mix)
    assert run.prefill_waiting_end == 1 and run.waiting_end == 1
    assert run.wait_all == (0.0 + 5.0) / 2  # C waited 0 s so far at the end, B 5 s


def test_shape_table_shows_wait_and_placed_of_asked_per_column() -> None:
    run = _one_gpu_replay()
    lines = shape_table({"first-fit": [run], "other": [Run(by_shape={"1gpu": (2, 1, 3.0)})]})
    assert lines[0].split()[-2:] == ["first-fit", "other"]
    assert lines[1].split() == ["1gpu", "8", "(2/2)", "3", "(1/2)"]


def test_split_tp_keeps_the_offered_work() -> None:
    from bench.placement.placement_waits import split_tp

    tp8 = model.Request(id="t", gpus_per_member=8, tp_size=8)
    mig = model.Request(id="m", mig_profile="3g")
    work = Workload(requests=[tp8, mig], arrivals=[1.0, 2.0], durations=[10.0, 20.0], prefill=[(tp8, 5.0)])
    got = split_tp(work)
    assert [r.total_gpus for r in got.requests] == [1] * 8 + [0]  # a MIG request asks no whole GPU
    assert got.requests[-1] is mig
    assert got.arrivals == [1.0] * 8 + [2.0] and got.durations == [10.0] * 8 + [20.0]
    assert [res for _, res in got.prefill] == [5.0] * 8
    assert len({r.id for r in got.requests}) == 9
