"""What one placement replay measured, the side-by-side tables, and the issue's targets checked against them.

Pure: :class:`Run` values in, lines of text and :class:`Check` verdicts out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.trace import NVL72, Topology

POLICIES = ("gpuplane", "best-fit", "first-fit", "spread")


@dataclass(slots=True)
class Run:
    """Measurements of one replay."""

    placed: int = 0
    waiting_end: int = 0
    wait_mean: float = 0.0
    wait_p99: float = 0.0
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
    names = [p for p in POLICIES if p in runs]
    width = 20
    lines = [title, f"{'metric':<28}" + "".join(f"{n:>{width}}" for n in names)]
    for label, fmt, get in METRICS:
        cells = []
        for n in names:
            m, sd = mean_sd([get(r) for r in runs[n]])
            cell = fmt.format(m) + (" ± " + fmt.format(sd) if len(runs[n]) > 1 else "")
            cells.append(f"{cell:>{width}}")
        lines.append(f"{label:<28}" + "".join(cells))
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


def _rel(a: float, b: float) -> str:
    if b == 0:
        return "best-fit is 0" if a else "both 0"
    return f"{100.0 * (a - b) / b:+.1f}%"
