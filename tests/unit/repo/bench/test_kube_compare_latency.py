"""bench.kube.kube_compare.added_latency: creation -> bound for the pods no mode kept waiting, with its gate part."""

from __future__ import annotations

from typing import Any

from bench.kube.kube_compare import added_latency


def pod(created: float, bound: float | None, ungated: float | None = None) -> dict[str, Any]:
    return {"created": created, "bound": bound, "gated": ungated is not None, "ungated": ungated}


def test_only_pods_fast_in_every_mode_count_and_the_gate_part_is_split_out() -> None:
    today = {"a": pod(0.0, 0.070), "b": pod(0.0, 0.080), "c": pod(0.0, 5.0), "d": pod(0.0, 0.060)}
    steered = {
        "a": pod(0.0, 0.140, ungated=0.050),
        "b": pod(0.0, 0.160, ungated=0.060),
        "c": pod(0.0, 0.100, ungated=0.040),  # fast here, but waited today: left out
        "d": pod(0.0, None, ungated=0.050),  # never bound steered: left out
    }
    lines = added_latency({"today": {"pods": today}, "steered": {"pods": steered}})
    assert lines[0].startswith("### creation -> bound, the 2 pods")
    assert lines[1] == "     today: creation -> bound 70"  # nearest rank: the lower of two
    assert (
        lines[2] == "   steered: creation -> bound 140 = creation -> gate lifted 50 + gate lifted -> bound 90 (2 gated)"
    )


def test_every_bench_percentile_is_the_one_nearest_rank_definition() -> None:
    from bench.dra import dra_overhead, dra_stages
    from bench.driver import driver_bench
    from bench.placement import placement_report

    xs = [float(x) for x in range(10, 0, -1)]  # unsorted on purpose
    pct = placement_report.percentile
    assert (pct(xs, 0.5), pct(xs, 0.99), pct(xs, 0.0), pct(xs, 1.0), pct([], 0.5)) == (5.0, 10.0, 1.0, 10.0, 0.0)
    assert pct([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], 0.5) == 6.0
    assert dra_stages.percentile is pct and dra_overhead.percentile is pct and driver_bench.pct is pct
