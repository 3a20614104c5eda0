"""Tiers on a time-sliced GPU: which interval the GPU gets, and which tiers may share it. Pure.

What NVML allows: one compute time-slice per GPU, for every process on it (``nvidia-smi
compute-policy --set-timeslice={0,1,2,3}``: default, short, medium, long; no per-process or
per-context value), so claims that time-slice one GPU share one interval.

The rule: a tier is an interval (the DeviceClasses ``timeslice-{gold,silver,bronze}.gpu.gpuplane.dev``:
gold ``Short``, silver ``Medium``, bronze ``Long``; ``Default`` is untiered). A short slice is
what latency-bound work wants (it waits less for its turn), a long one what throughput-bound work
wants (fewer context switches). When tiers share a GPU, the GPU is set to the interval of the
highest tier on it, so the gold tenant gets the slice it asked for and the bronze one gives way;
when the gold claim leaves, the GPU goes back to the next tier's interval. A claim never lands on
a GPU time-sliced by a different tier unless the higher tier's class allows it
(``timeSlicing.shareWithLowerTiers: true``): a gold claim with a bronze one only with the gold
class's consent, whichever came first.
"""

from __future__ import annotations

from collections.abc import Iterable

RANK: dict[str, int] = {"Short": 3, "Medium": 2, "Long": 1, "Default": 0}
TIER: dict[str, str] = {"Short": "gold", "Medium": "silver", "Long": "bronze", "Default": "untiered"}


def rank(interval: str | None) -> int:
    """The tier rank of an interval (unknown or None: untiered)."""
    return RANK.get(interval or "Default", 0)


def gpu_interval(intervals: Iterable[str | None]) -> str:
    """The interval a GPU time-sliced by claims with these intervals is set to: the highest tier's."""
    best = max(intervals, key=rank, default=None)
    return best or "Default"


def mix_refusal(mine: tuple[str | None, bool], theirs: tuple[str | None, bool], other: str, device: str) -> str | None:
    """Why a claim (interval, shareWithLowerTiers) may not join ``other`` on ``device``; None when it may."""
    a, b = mine[0] or "Default", theirs[0] or "Default"
    if a == b:
        return None
    higher, allowed = (mine, "this claim") if rank(a) > rank(b) else (theirs, f"claim {other}")
    if higher[1]:
        return None
    return (
        f"device {device} is time-sliced by claim {other} of tier {TIER[b]} (interval {b}); this claim is tier "
        f"{TIER[a]} (interval {a}). Tiers share a GPU only when the higher tier's class allows it "
        f"(timeSlicing.shareWithLowerTiers, not set for {allowed}); the scheduler may place it on another GPU "
        "once this pod is recreated"
    )
