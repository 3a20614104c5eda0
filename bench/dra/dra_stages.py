"""The stage breakdown of the DRA-overhead benchmark (``--stages``): where each pod's time went.

Pooled per stage from the watches' arrival times (:mod:`bench.dra.dra_watch`), the kubelet stand-ins'
per-pod timing lines, the drivers' prepare-RPC metrics and the CPU seconds of each component
(``/proc``). Reads logs, metrics endpoints and ``/proc``; the tables are pure.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import statistics
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.dra.dra_setup import NAMESPACE
from bench.dra.dra_watch import ClaimWatch, RunningWatch
from bench.placement.placement_report import percentile
from e2e.cluster import procs
from e2e.plane import simnodes

Stages = dict[str, list[float]]
"""Stage name -> one duration (s) per pod, pooled over rounds."""

NODE_LINE = re.compile(
    r"pod (?P<ns>[^/\s]+)/(?P<name>\S+) running: total_ms=(?P<total>[\d.]+) wait_ms=(?P<wait>[\d.]+) "
    r"tries=(?P<tries>\d+) claims_ms=(?P<claims>[\d.]+) prepare_ms=(?P<prepare>[\d.]+) status_ms=(?P<status>[\d.]+)"
    r"(?: first_wait=(?P<why>.*))?"
)
NODE_FIELDS = {
    "wait": "stand-in: bound seen -> claims ready (poll)",
    "claims": "stand-in: claim reads (GET)",
    "prepare": "stand-in: NodePrepareResources call",
    "status": "stand-in: Running status write",
    "total": "stand-in: bound seen -> Running written",
}


def node_lines(
    sim: simnodes.SimNodes, names: Sequence[str], waits: collections.Counter[str], timeout: float = 10.0
) -> dict[str, dict[str, float]]:
    """The stand-ins' per-pod timing lines (ms) for ``names``, from the kubelet logs.

    Counts in ``waits`` why a first start attempt found a pod not ready (claim names left out).
    """
    wanted = set(names)
    found: dict[str, dict[str, float]] = {}
    why: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        for node in sim.started:
            with contextlib.suppress(OSError):
                for line in sim.log(node.kubelet_process).read_text(errors="replace").splitlines():
                    m = NODE_LINE.search(line)
                    if m and m["ns"] == NAMESPACE and m["name"] in wanted:
                        found[m["name"]] = {k: float(m[k]) for k in (*NODE_FIELDS, "tries")}
                        reason = (m["why"] or "''").strip("'\"")
                        why[m["name"]] = re.sub(r"claim \S+", "claim", reason) or "(none: started at once)"
        if len(found) == len(wanted) or time.monotonic() > deadline:
            waits.update(why.values())
            return found
        time.sleep(0.2)


def driver_prepare_metrics(sim: simnodes.SimNodes) -> dict[str, tuple[float, float]]:
    """Per node: (sum, count) of ``gpuplane_driver_rpc_duration_seconds{op="prepare"}`` from its /metrics."""
    out: dict[str, tuple[float, float]] = {}
    for node in sim.started:
        total = count = 0.0
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as response:
                text = response.read().decode()
            for line in text.splitlines():
                if line.startswith("gpuplane_driver_rpc_duration_seconds_sum{") and 'op="prepare"' in line:
                    total = float(line.rsplit(" ", 1)[1])
                elif line.startswith("gpuplane_driver_rpc_duration_seconds_count{") and 'op="prepare"' in line:
                    count = float(line.rsplit(" ", 1)[1])
        out[node.name] = (total, count)
    return out


def cpu_seconds(state_dir: Path) -> dict[str, float]:
    """CPU seconds (user + system) so far per component group, and ``machine busy`` over all CPUs (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, record in procs.read_records(state_dir / "pids").items():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{record.pid}/stat").read_text().rsplit(")", 1)[1].split()
            group = name.split("-hgx")[0] if "-hgx" in name else name  # driver-<node>, kubelet-<node>: summed
            out[group] = out.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    own = os.times()
    out["bench + kubectl"] = own.user + own.system + own.children_user + own.children_system
    with contextlib.suppress(OSError, ValueError):
        jiffies = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        out["machine busy"] = (sum(jiffies) - jiffies[3] - jiffies[4]) / tick  # all but idle and iowait
    return out


def add_cpu(total: dict[str, float], before: Mapping[str, float], after: Mapping[str, float]) -> None:
    """Add the CPU seconds spent between two ``cpu_seconds`` samples to ``total``."""
    for key, value in after.items():
        total[key] = total.get(key, 0.0) + value - before.get(key, 0.0)


def collect_stages(
    stages: Stages,
    started: float,
    names: Sequence[str],
    *,
    pods: RunningWatch,
    claims: ClaimWatch | None,
    node: Mapping[str, Mapping[str, float]],
) -> None:
    """Add each pod's stage durations (s) to ``stages``; a stage with a missing timestamp is skipped."""

    def add(stage: str, end: Mapping[str, float], begin: Mapping[str, float] | float) -> None:
        for n in names:
            t0 = begin if isinstance(begin, float) else begin.get(n)
            t1 = end.get(n)
            if t0 is not None and t1 is not None:
                stages.setdefault(stage, []).append(t1 - t0)

    add("apply -> pod created (kubectl, one pod at a time)", pods.created, started)
    if claims is None:
        add("pod created -> bound (scheduler)", pods.bound, pods.created)
        add("apply -> bound", pods.bound, started)
    else:
        add("pod created -> claim created (KCM)", claims.created, pods.created)
        add("claim created -> pod claim status (KCM)", pods.claim_status, claims.created)
        add("claim created -> allocated (scheduler)", claims.allocated, claims.created)
        add("pod claim status -> allocated (scheduler)", claims.allocated, pods.claim_status)
        add("allocated -> bound (scheduler)", pods.bound, claims.allocated)
        add("apply -> bound", pods.bound, started)
    add("bound -> Running (node side)", pods.running, pods.bound)
    add("apply -> Running", pods.running, started)
    for n in names:
        for key, stage in NODE_FIELDS.items():
            if n in node:
                stages.setdefault(stage, []).append(node[n][key] / 1000)
        if n in node:
            stages.setdefault("stand-in: start attempts", []).append(node[n]["tries"])


def cpu_table(plain: Mapping[str, float], dra: Mapping[str, float]) -> str:
    """CPU seconds per component during the rounds, as a Markdown table."""
    keys = sorted(set(plain) | set(dra), key=lambda k: (k.startswith(("wall", "machine")), -dra.get(k, 0.0)))
    rows = ["| component | CPU s, without claims | CPU s, with a claim |", "|---|---|---|"]
    rows += [f"| {k} | {plain.get(k, 0.0):.2f} | {dra.get(k, 0.0):.2f} |" for k in keys]
    return "\n".join(rows) + "\n"


def stage_table(plain: Stages, dra: Stages, prepare: tuple[float, float]) -> str:
    """The stage breakdown as a Markdown table (also printed)."""
    rows = ["| pods | stage | n | p50 (ms) | p99 (ms) | max (ms) | mean (ms) |", "|---|---|---|---|---|---|---|"]
    for kind, stages in (("without claims", plain), ("with a claim", dra)):
        for stage, values in stages.items():
            if stage == "stand-in: start attempts":
                rows.append(
                    f"| {kind} | {stage} | {len(values)} | {percentile(values, 0.5):.0f} | "
                    f"{percentile(values, 0.99):.0f} | {max(values):.0f} | {statistics.fmean(values):.2f} |"
                )
                continue
            ms = [v * 1000 for v in values]
            rows.append(
                f"| {kind} | {stage} | {len(ms)} | {percentile(ms, 0.5):.0f} | {percentile(ms, 0.99):.0f} | "
                f"{max(ms):.0f} | {statistics.fmean(ms):.0f} |"
            )
    total, count = prepare
    if count:
        rows.append(
            f"| with a claim | driver: NodePrepareResources (metrics sum/count, all nodes) | {count:.0f} | | | | "
            f"{total / count * 1000:.1f} |"
        )
    return "\n".join(rows) + "\n"
