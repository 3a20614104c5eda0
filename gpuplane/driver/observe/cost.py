"""Cost attribution: GPU time per claim = (fraction of the device held) x (wall time).

Fractions (one per allocated device of a claim; a claim's total is their sum):

* whole GPU, exclusive: **1**;
* MIG device: **memory slices / 8** (``MigRecord.size / 8``). Memory slices, not compute slices,
  because placement exclusivity is defined over memory slices: a 3g.40gb instance (3 of 7 compute
  slices) blocks 4 of the 8 memory slices, so two of them fill the GPU and together cost exactly
  1. With compute slices they would cost 6/7 and one seventh of a full GPU would be billed to
  nobody. (A 1g.10gb costs 1/8, 2g.20gb and 1g.20gb 2/8, 3g and 4g 4/8, 7g 8/8.)
* MPS: the claim's **SM quota**, ``mps_active_thread_percentage / 100`` (100 % when the claim has
  no quota: it may use every SM);
* time-slicing: **1 / n** for the n time-slicing claims on the GPU at that moment.

Accounting (:class:`CostAccountant`) is a left Riemann sum over the driver's sampling ticks: the
holdings seen at tick k are charged for the time until tick k+1, so a claim's start and end are
known to within one tick (10 s by default). Time while the driver is down is not charged.

Results go two ways:

* the Prometheus counter ``gpuplane_gpu_seconds_total{namespace, tier, kind}`` (per node; sum it
  over nodes), and
* the node's **ledger**, ``<plugin_dir>/cost-ledger.jsonl``: one JSON line per (claim, device)
  segment of constant fraction, at most ``flush_interval_s`` long, with ``start``, ``end``,
  ``fraction`` and ``gpu_seconds``.

``python -m gpuplane.driver.observe.cost summary --ledger FILE [--ledger FILE ...] --window 24h [--end T]
[--by namespace,tier|claim]`` prints a table over a window (segments that straddle the window
edge are pro-rated). From a cluster: ``kubectl exec -n gpuplane ds/gpuplane-driver -- python -m
gpuplane.driver.observe.cost summary --window 24h`` per node, or copy the ledgers out and pass them all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuplane.api import kubetime
from gpuplane.api.ledger import Segment
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, DeviceRecord

MIG_MEMORY_SLICES = 8
LEDGER_FILE = "cost-ledger.jsonl"

TIER_WHOLE = "whole"
TIER_MIG = "mig"
TIER_TIMESLICING = "timeslicing"
TIER_MPS = "mps"


@dataclass(frozen=True)
class Holding:
    """One device held by one claim at one moment, with the fraction it is charged for."""

    claim_uid: str
    namespace: str
    name: str
    tier: str
    kind: str  # "gpu" | "mig" | "mps" | "timeslicing"
    gpu_uuid: str
    device: str  # the DRA device name (gpu-0, gpu-0-mig-3g-40gb-4)
    fraction: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.claim_uid, self.device)


def claim_kind(rec: ClaimRecord) -> str:
    strategy = rec.sharing.strategy
    if strategy == "MPS":
        return "mps"
    if strategy == "TimeSlicing":
        return "timeslicing"
    if any(d.kind == "mig" for d in rec.devices):
        return "mig"
    return "gpu"


def default_tier(rec: ClaimRecord) -> str:
    """Tier when no device class says otherwise: by how the device is held."""
    return {"mps": TIER_MPS, "timeslicing": TIER_TIMESLICING, "mig": TIER_MIG}.get(claim_kind(rec), TIER_WHOLE)


def device_fraction(rec: ClaimRecord, dev: DeviceRecord, timeslice_holders: int = 1) -> float:
    """The fraction of a physical GPU that ``dev`` of claim ``rec`` stands for (see module doc)."""
    if dev.kind == "mig" and dev.mig is not None:
        return dev.mig.size / MIG_MEMORY_SLICES
    if rec.sharing.strategy == "MPS":
        pct = rec.sharing.mps_active_thread_percentage
        return 1.0 if pct is None else pct / 100.0
    if rec.sharing.strategy == "TimeSlicing":
        return 1.0 / max(1, timeslice_holders)
    return 1.0


def holdings(cp: Checkpoint, tier_of: Callable[[ClaimRecord], str] = default_tier) -> list[Holding]:
    """Everything held on the node now: completed claims of the checkpoint, device by device."""
    done = [r for r in cp.claims.values() if r.phase == "PrepareCompleted"]
    ts_count: dict[str, int] = {}
    for rec in done:
        if rec.sharing.strategy == "TimeSlicing":
            for uuid in {d.gpu_uuid for d in rec.devices if d.kind == "gpu"}:
                ts_count[uuid] = ts_count.get(uuid, 0) + 1
    out: list[Holding] = []
    for rec in sorted(done, key=lambda r: r.uid):
        tier = tier_of(rec)
        kind = claim_kind(rec)
        for dev in rec.devices:
            out.append(
                Holding(
                    claim_uid=rec.uid,
                    namespace=rec.namespace,
                    name=rec.name,
                    tier=tier,
                    kind=kind,
                    gpu_uuid=dev.gpu_uuid,
                    device=dev.device,
                    fraction=device_fraction(rec, dev, ts_count.get(dev.gpu_uuid, 1)),
                )
            )
    return out


# --- the ledger -------------------------------------------------------------------------------


class CostSink(Protocol):
    """Counter hook (Prometheus in the driver)."""

    def charge(self, namespace: str, tier: str, kind: str, gpu_seconds: float) -> None: ...


class CostAccountant:
    """Integrates holdings over ticks; writes ledger segments; thread-safe."""

    def __init__(
        self,
        ledger_path: Path | None,
        node: str,
        *,
        flush_interval_s: float = 300.0,
        sink: CostSink | None = None,
    ) -> None:
        self.ledger_path = ledger_path
        self.node = node
        self.flush_interval_s = flush_interval_s
        self.sink = sink
        self._lock = threading.Lock()
        self._prev: dict[tuple[str, str], Holding] = {}
        self._last: float | None = None
        self._open: dict[tuple[str, str], Segment] = {}
        self.totals: dict[tuple[str, str], float] = {}  # (namespace, tier) -> GPU-seconds

    def tick(self, current: Sequence[Holding], now: float) -> list[Segment]:
        """Charge the previous tick's holdings up to ``now``; returns the segments written."""
        written: list[Segment] = []
        with self._lock:
            if self._last is not None and now > self._last:
                dt = now - self._last
                for key, h in self._prev.items():
                    seg = self._open.get(key)
                    if seg is not None and seg.fraction == h.fraction and seg.end == self._last:
                        self._open[key] = _extend(seg, now)
                    else:
                        if seg is not None:
                            written.append(seg)
                        self._open[key] = self._segment(h, self._last, now)
                    charge = h.fraction * dt
                    tk = (h.namespace, h.tier)
                    self.totals[tk] = self.totals.get(tk, 0.0) + charge
                    if self.sink is not None:
                        self.sink.charge(h.namespace, h.tier, h.kind, charge)
            now_keys = {h.key for h in current}
            for key in list(self._open):
                seg = self._open[key]
                if key not in now_keys or seg.end - seg.start >= self.flush_interval_s:
                    written.append(self._open.pop(key))
            self._prev = {h.key: h for h in current}
            self._last = now
            self._append(written)
        return written

    def flush(self) -> list[Segment]:
        """Write every open segment (on shutdown)."""
        with self._lock:
            written = list(self._open.values())
            self._open.clear()
            self._append(written)
        return written

    def _segment(self, h: Holding, start: float, end: float) -> Segment:
        return Segment(
            start=start,
            end=end,
            node=self.node,
            claim_uid=h.claim_uid,
            namespace=h.namespace,
            name=h.name,
            tier=h.tier,
            kind=h.kind,
            device=h.device,
            fraction=h.fraction,
        )

    def _append(self, segments: Sequence[Segment]) -> None:
        if not segments or self.ledger_path is None:
            return
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(s.to_json() + "\n" for s in segments).encode()
        fd = os.open(self.ledger_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)  # one write per tick: lines from one tick land together
        finally:
            os.close(fd)


def _extend(seg: Segment, end: float) -> Segment:
    return Segment(**{**asdict(seg), "end": end})


def read_ledger(paths: Iterable[Path]) -> Iterator[Segment]:
    """Segments from ledger files; a torn last line (crash mid-write) is skipped."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    yield Segment.from_json(line)
                except (ValueError, KeyError, TypeError):
                    continue


# --- summaries --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    group: tuple[str, ...]
    claims: int
    gpu_seconds: float

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0


GROUPINGS: Mapping[str, Callable[[Segment], str]] = {
    "namespace": lambda s: s.namespace,
    "tier": lambda s: s.tier,
    "kind": lambda s: s.kind,
    "node": lambda s: s.node,
    "claim": lambda s: f"{s.namespace}/{s.name}",
}


def summarize(
    segments: Iterable[Segment], start: float, end: float, by: Sequence[str] = ("namespace", "tier")
) -> list[Row]:
    """GPU-seconds per group over [start, end); straddling segments are pro-rated."""
    acc: dict[tuple[str, ...], float] = {}
    claims: dict[tuple[str, ...], set[str]] = {}
    for seg in segments:
        lo, hi = max(seg.start, start), min(seg.end, end)
        if hi <= lo:
            continue
        group = tuple(GROUPINGS[g](seg) for g in by)
        acc[group] = acc.get(group, 0.0) + seg.fraction * (hi - lo)
        claims.setdefault(group, set()).add(seg.claim_uid)
    return [Row(g, len(claims[g]), acc[g]) for g in sorted(acc)]


def render(rows: Sequence[Row], by: Sequence[str], start: float, end: float) -> str:
    """A kubectl-style table with a total line."""
    headers = [b.upper() for b in by] + ["CLAIMS", "GPU-HOURS"]
    body = [[*r.group, str(r.claims), f"{r.gpu_hours:.3f}"] for r in rows]
    total = sum(r.gpu_seconds for r in rows) / 3600.0
    body.append(["TOTAL"] + [""] * (len(by) - 1) + [str(sum(r.claims for r in rows)), f"{total:.3f}"])
    widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(headers)]
    fmt = "   ".join(f"{{:<{w}}}" for w in widths[:-1]) + f"   {{:>{widths[-1]}}}"
    window = f"# window {kubetime.rfc3339(start)} .. {kubetime.rfc3339(end)} ({(end - start) / 3600:.1f}h)"
    return "\n".join([window, fmt.format(*headers), *(fmt.format(*line) for line in body)])


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_duration(text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"bad duration {text!r}: use e.g. 90s, 30m, 24h, 7d")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _parse_time(text: str) -> float:
    if text == "now":
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    moment = kubetime.epoch(text)
    if moment is None:
        raise ValueError(f"not a time: {text!r} (give unix seconds, an RFC 3339 time or 'now')")
    return moment


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpuplane.driver.observe.cost", description="GPU cost attribution from driver ledgers"
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="GPU-hours per group over a window")
    s.add_argument(
        "--ledger",
        action="append",
        type=Path,
        help=f"ledger file (repeatable); default $GPUPLANE_PLUGIN_DIR/{LEDGER_FILE}",
    )
    s.add_argument("--window", default="24h", help="window length ending at --end (e.g. 24h, 7d)")
    s.add_argument("--end", default="now", help="window end: unix seconds, ISO 8601, or 'now'")
    s.add_argument("--by", default="namespace,tier", help=f"comma list of {sorted(GROUPINGS)}")
    s.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = p.parse_args(argv)
    ledgers = args.ledger or [
        Path(os.environ.get("GPUPLANE_PLUGIN_DIR", "/var/lib/kubelet/plugins/gpu.gpuplane.dev")) / LEDGER_FILE
    ]
    by = [b.strip() for b in args.by.split(",") if b.strip()]
    unknown = set(by) - set(GROUPINGS)
    if unknown:
        p.error(f"unknown --by {sorted(unknown)}; choose from {sorted(GROUPINGS)}")
    end = _parse_time(args.end)
    start = end - parse_duration(args.window)
    rows = summarize(read_ledger(ledgers), start, end, by)
    if args.output == "json":
        out: dict[str, Any] = {
            "window": {"start": start, "end": end},
            "rows": [
                {**dict(zip(by, r.group, strict=True)), "claims": r.claims, "gpuHours": r.gpu_hours} for r in rows
            ],
            "totalGpuHours": sum(r.gpu_hours for r in rows),
        }
        print(json.dumps(out, indent=1))
    else:
        print(render(rows, by, start, end))
    return 0


if __name__ == "__main__":
    sys.exit(main())
