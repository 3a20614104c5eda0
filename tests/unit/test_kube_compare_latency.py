"""bench.kube_compare.added_latency: creation -> bound for the pods no mode kept waiting, with its gate part."""

from __future__ import annotations

from typing import Any

from bench.kube_compare import added_latency


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
    assert lines[1] == "     today: creation -> bound 80"
    assert (
        lines[2]
        == "   steered: creation -> bound 160 = creation -> gate lifted 60 + gate lifted -> bound 100 (2 gated)"
    )
