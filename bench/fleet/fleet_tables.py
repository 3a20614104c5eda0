"""Fleet benchmark, measurement 1 in tables: the scheduler rounds of ``bench.fleet.fleet_sched`` as Markdown.

``table`` lists each round (throughput, creation->bound, kube-scheduler's own histograms, CPU per
pod); ``ratios`` sets the rounds side by side per claim kind: (a)/(c) the cost of DRA, (a)/(b) the
cost of MIG placements, (a0)/(a) counter slices per GPU against packed, (a)/(a+) the cluster's
kube-scheduler against the newer one.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.fleet.fleet_sched import KIND_TEXT, KINDS, MIG_KINDS, SCHED_POINTS, Round


def table(rounds: Sequence[Round]) -> str:
    """Markdown table of the rounds, with the ratios (a)/(c) and (a)/(b) per kind."""

    def f(value: float | None, fmt: str = "{:.1f}") -> str:
        return "" if value is None else fmt.format(value)

    head = (
        "| fleet | pods | n | bound | pods/s | creates s | creation->bound p50 s | p99 s | "
        "sched cycle p50 ms | p99 ms | mean ms | queue->bound p50 ms | p99 ms | PreFilter ms | Filter ms | "
        "Reserve ms | PreBind ms | cycles | scheduler CPU ms/pod |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rounds:
        rows.append(
            f"| {r.fleet} | {KIND_TEXT[r.kind]} | {r.pods} | {r.bound} | {r.throughput:.3g} | {r.create_s:.1f} | "
            f"{r.latency['p50']:.2f} | {r.latency['p99']:.2f} | {f(r.attempt_ms['p50'])} | {f(r.attempt_ms['p99'])} | "
            f"{f(r.attempt_ms['mean'])} | {f(r.sli_ms['p50'])} | {f(r.sli_ms['p99'])} | "
            + " | ".join(f(r.points_ms[p], "{:.2f}") for p in SCHED_POINTS)
            + f" | {r.attempts:.0f} | {r.sched_cpu_s * 1000 / max(r.bound, 1):.0f} |"
        )
    return "\n".join(rows) + "\n"


def ratios(rounds: Sequence[Round]) -> str:
    """Markdown table: per claim kind, (a)/(c), (a)/(b) and (a0)/(a) of throughput, latency and scheduling cycle."""
    by = {(r.fleet, r.kind): r for r in rounds}
    plain = by.get(("c", "none"))
    rows = [
        "| pods | ratio | pods/s | creation->bound p50 | p99 | sched cycle mean | scheduler CPU per pod |",
        "|---|---|---|---|---|---|---|",
    ]

    def ratio(x: float | None, y: float | None) -> str:
        return f"{x / y:.2f}x" if x is not None and y else ""

    for kind in KINDS[1:]:
        after = by.get(("a", kind))
        for name, a, base in (
            ("(a)/(c) DRA cost", after, plain),
            ("(a)/(b) cost of MIG placements", after, by.get(("b", kind))),
            (
                "(a) MIG over (b) one whole GPU (issue 36: <= 3x)",
                after if kind in MIG_KINDS else None,
                by.get(("b", "gpu-1")),
            ),
            ("(a0)/(a) one counter slice per GPU (before) over packed (after)", by.get(("a0", kind)), after),
            ("(a)/(a+) the cluster's kube-scheduler over the newer one", after, by.get(("a+", kind))),
        ):
            if a is None or base is None:
                continue
            rows.append(
                f"| {KIND_TEXT[kind]} | {name} | {ratio(a.throughput, base.throughput)} | "
                f"{ratio(a.latency['p50'], base.latency['p50'])} | {ratio(a.latency['p99'], base.latency['p99'])} | "
                f"{ratio(a.attempt_ms['mean'], base.attempt_ms['mean'])} | "
                f"{ratio(a.sched_cpu_s / max(a.bound, 1), base.sched_cpu_s / max(base.bound, 1))} |"
            )
    return "\n".join(rows) + "\n"
