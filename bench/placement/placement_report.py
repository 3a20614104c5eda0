"""What one placement replay measured, the side-by-side tables, and the issue's targets checked against them.

Pure: :class:`Run` values in, lines of text and :class:`Check` verdicts out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.placement.trace import NVL72, Topology

BASELINES = ("gpuplane", "best-fit", "first-fit", "spread")
TODAY = "kube-scheduler (today)"
STEERED = "kube-scheduler + gpuplane steering"
POLICIES = (*BASELINES, TODAY, STEERED)
LEVERS = (
    "+ withhold",
    "+ order",
    "+ order + withhold",
    "+ node",
    "+ steering, driver on the prior mix",
    "+ steering, queue in the controller",
)


@dataclass(slots=True)
class Run:
    """Measurements of one replay."""

    placed: int = 0
    waiting_end: int = 0
    wait_mean: float = 0.0
    wait_p99: float = 0.0
    wait_mig: float = 0.0  # mean wait of MIG requests
    wait_whole: float = 0.0  # mean wait of whole-GPU requests (1 GPU and TP groups)
    wait_units: float = 0.0  # mean wait weighted by the capacity each request asks for
    prefill_waiting_end: int = 0  # warm-start requests that never got placed (not in the waits above)
    wait_all: float = 0.0  # mean wait incl. the warm-start requests that had to queue (waiting from 0)
    wait_all_units: float = 0.0  # the same, weighted by the capacity each request asks for
    by_shape: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # label -> (requests, placed, mean wait)
    frag: float = 0.0
    frag_pct: float = 0.0
    slivers: float = 0.0
    tp8: float = 0.0
    gpu_waiting: float = 0.0  # % of samples with a one-GPU request in the queue (then no GPU is empty)
    util: float = 0.0
    crossings: int = 0
    lat_p50_us: float = 0.0
    lat_p99_us: float = 0.0
    decisions: int = 0
    dropped_prefill: int = 0  # warm-start pods that had to queue
    seconds: float = 0.0


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for an empty list)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


METRICS: tuple[tuple[str, str, Callable[[Run], float]], ...] = (
    ("requests placed", "{:.0f}", lambda r: r.placed),
    ("waiting at end", "{:.1f}", lambda r: r.waiting_end),
    ("mean wait (s)", "{:.0f}", lambda r: r.wait_mean),
    ("p99 wait (s)", "{:.0f}", lambda r: r.wait_p99),
    ("mean wait, MIG requests (s)", "{:.0f}", lambda r: r.wait_mig),
    ("mean wait, whole GPUs (s)", "{:.0f}", lambda r: r.wait_whole),
    ("mean wait per GPU asked (s)", "{:.0f}", lambda r: r.wait_units),
    ("warm start waiting at end", "{:.1f}", lambda r: r.prefill_waiting_end),
    ("mean wait incl. warm start (s)", "{:.0f}", lambda r: r.wait_all),
    ("  per GPU asked (s)", "{:.0f}", lambda r: r.wait_all_units),
    ("fragmentation (GPUs)", "{:.1f}", lambda r: r.frag),
    ("fragmentation (% free)", "{:.1f}", lambda r: r.frag_pct),
    ("slivers on partial GPUs", "{:.1f}", lambda r: r.slivers),
    ("TP8-capable domains", "{:.2f}", lambda r: r.tp8),
    ("samples with a 1-GPU waiting (%)", "{:.0f}", lambda r: r.gpu_waiting),
    ("utilisation (%)", "{:.1f}", lambda r: r.util),
    ("TP groups crossing domains", "{:.0f}", lambda r: r.crossings),
    ("decision p50 (us)", "{:.0f}", lambda r: r.lat_p50_us),
    ("decision p99 (us)", "{:.0f}", lambda r: r.lat_p99_us),
)


def mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def table(title: str, runs: dict[str, list[Run]]) -> list[str]:
    """One side-by-side table: metric rows, policy columns, mean ± sd over seeds."""
    names = list(runs)
    widths = [max(20, len(n) + 2) for n in names]
    lines = [title, f"{'metric':<32}" + "".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))]
    for label, fmt, get in METRICS:
        cells = []
        for n, w in zip(names, widths, strict=True):
            m, sd = mean_sd([get(r) for r in runs[n]])
            cell = fmt.format(m) + (" ± " + fmt.format(sd) if len(runs[n]) > 1 else "")
            cells.append(f"{cell:>{w}}")
        lines.append(f"{label:<32}" + "".join(cells))
    return lines


def shape_table(runs: dict[str, list[Run]]) -> list[str]:
    """Mean wait (s) and requests placed / asked by request shape, policy columns, mean over seeds."""
    names = list(runs)
    widths = [max(20, len(n) + 2) for n in names]
    shapes = sorted({k for rs in runs.values() for r in rs for k in r.by_shape})
    lines = [f"{'wait by shape (placed/asked)':<32}" + "".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))]
    for k in shapes:
        cells = []
        for n, w in zip(names, widths, strict=True):
            got = [r.by_shape[k] for r in runs[n] if k in r.by_shape]
            asked, placed, wait = (statistics.fmean(x[j] for x in got) if got else 0.0 for j in range(3))
            cells.append(f"{f'{wait:.0f} ({placed:.0f}/{asked:.0f})':>{w}}")
        lines.append(f"{'  ' + k:<32}" + "".join(cells))
    return lines


@dataclass(slots=True)
class Check:
    """One target check."""

    what: str
    ok: bool
    detail: str


def avg(runs: list[Run], get: Callable[[Run], float]) -> float:
    """Mean of a metric over seeds."""
    return statistics.fmean(get(r) for r in runs)


def checks_for(scenario: str, topo: Topology, runs: dict[str, list[Run]]) -> list[Check]:
    """The issue's targets for one load scenario."""
    gp, bf, ff = runs["gpuplane"], runs["best-fit"], runs["first-fit"]
    out = [
        Check(
            f"{scenario}: zero TP crossings (all policies)",
            all(r.crossings == 0 for rs in runs.values() for r in rs),
            "crossings counted per decision",
        ),
    ]
    for label, get in (("mean wait", lambda r: r.wait_mean), ("waiting at end", lambda r: float(r.waiting_end))):
        g, b = avg(gp, get), avg(bf, get)
        ok = g <= b * 1.05 + 1e-9
        out.append(
            Check(f"{scenario}: {label} <= best-fit + 5%", ok, f"gpuplane {g:.1f} vs best-fit {b:.1f} ({_rel(g, b)})")
        )
    g, b, f = avg(gp, lambda r: r.frag), avg(bf, lambda r: r.frag), avg(ff, lambda r: r.frag)
    out.append(
        Check(
            f"{scenario}: fragmentation >= 5% below best-fit",
            g <= 0.95 * b,
            f"gpuplane {g:.1f} vs best-fit {b:.1f} GPUs ({_rel(g, b)})",
        )
    )
    out.append(
        Check(
            f"{scenario}: fragmentation >= 30% below first-fit",
            g <= 0.70 * f,
            f"gpuplane {g:.1f} vs first-fit {f:.1f} GPUs ({_rel(g, f)})",
        )
    )
    if topo is NVL72:
        g, b = avg(gp, lambda r: r.tp8), avg(bf, lambda r: r.tp8)
        detail = f"gpuplane {g:.2f} vs best-fit {b:.2f} ({_rel(g, b)})"
        if g == 0 and b == 0:
            # The replay is work-conserving: while a one-GPU request waits, no GPU is empty, so no domain
            # can take a TP8 group whatever the policy.
            wg, wb = avg(gp, lambda r: r.gpu_waiting), avg(bf, lambda r: r.gpu_waiting)
            detail += (
                f"; a 1-GPU request waited at {wg:.0f}% (gpuplane) / {wb:.0f}% (best-fit) of samples,"
                " and while one waits no GPU is empty"
            )
        out.append(Check(f"{scenario}: TP8-capable domains >= best-fit + 25%", g >= 1.25 * b and g > 0, detail))
    return out


def steering_checks(scenario: str, runs: dict[str, list[Run]]) -> list[Check]:
    """Issue 14's targets: the steered default path within 5 % of gpuplane, >= 20 % below today's, waiting no worse."""
    if TODAY not in runs or STEERED not in runs:
        return []
    gp, today, st = runs["gpuplane"], runs[TODAY], runs[STEERED]
    g, t, s = (avg(x, lambda r: r.frag) for x in (gp, today, st))
    out = [
        Check(
            f"{scenario}: steered fragmentation within 5% of gpuplane",
            s <= 1.05 * g + 1e-9,
            f"steered {s:.2f} vs gpuplane {g:.2f} GPUs ({_rel(s, g)})",
        ),
        Check(
            f"{scenario}: steered fragmentation >= 20% below today's default path",
            s <= 0.80 * t,
            f"steered {s:.2f} vs today {t:.2f} GPUs ({_rel(s, t)})",
        ),
    ]
    for label, get in (("mean wait", lambda r: r.wait_mean), ("mean wait per GPU asked", lambda r: r.wait_units)):
        a, b = avg(st, get), avg(today, get)
        out.append(
            Check(
                f"{scenario}: steered {label} no worse than today's (+5%)",
                a <= 1.05 * b + 1e-9,
                f"steered {a:.0f} vs today {b:.0f} s ({_rel(a, b)})",
            )
        )
    return out


def compact(title: str, runs: dict[str, list[Run]]) -> list[str]:
    """One line per column: fragmentation, mean wait, wait per GPU asked, the two incl. the warm start, placed."""
    lines = [
        title,
        f"{'policy':<40}{'fragmentation (GPUs)':>22}{'mean wait (s)':>16}{'wait/GPU (s)':>16}"
        f"{'incl. warm start':>18}{'/GPU':>14}{'placed':>12}",
    ]
    for name, rs in runs.items():
        cells = []
        for get, fmt, w in (
            (lambda r: r.frag, "{:.1f}", 22),
            (lambda r: r.wait_mean, "{:.0f}", 16),
            (lambda r: r.wait_units, "{:.0f}", 16),
            (lambda r: r.wait_all, "{:.0f}", 18),
            (lambda r: r.wait_all_units, "{:.0f}", 14),
            (lambda r: float(r.placed), "{:.0f}", 12),
        ):
            m, sd = mean_sd([get(r) for r in rs])
            cell = fmt.format(m) + (" ± " + fmt.format(sd) if len(rs) > 1 else "")
            cells.append(f"{cell:>{w}}")
        lines.append(f"{name:<40}" + "".join(cells))
    return lines


def _rel(a: float, b: float) -> str:
    if b == 0:
        return "best-fit is 0" if a else "both 0"
    return f"{100.0 * (a - b) / b:+.1f}%"
