"""CPU profiles of kube-scheduler during the fleet bench's scheduler rounds (``fleet_scale --pprof DIR``).

kube-scheduler serves Go's pprof on its secure port (``/debug/pprof/profile``; ``--profiling`` is on by
default) behind delegated authorization, which lets the cluster admin's client certificate
(``system:masters``) read it. :meth:`SchedulerProfiler.during` takes one CPU profile while a round runs
(a fixed window that covers the round; the idle rest adds no samples), saved as
``<dir>/<round>.pb.gz``; :func:`top` summarises one with ``go tool pprof -top`` (flat or cumulative), so the
report says where the scheduler's CPU went for each kind of pod: the allocator, CEL, counters, GC.
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from e2e.cluster import procs
from e2e.cluster.pki import CertPair


class SchedulerProfiler:
    """Profiles the kube-scheduler of the control plane in ``state_dir`` into ``out_dir``."""

    def __init__(self, state_dir: Path, admin: CertPair, ca_cert: Path, out_dir: Path, seconds: int = 15) -> None:
        self.state_dir = state_dir
        self.out_dir = out_dir
        self.seconds = seconds
        self.context = ssl.create_default_context(cafile=str(ca_cert))
        self.context.check_hostname = False  # the scheduler serves a self-signed certificate
        self.context.verify_mode = ssl.CERT_NONE
        self.context.load_cert_chain(str(admin.cert), str(admin.key))
        self.profiles: dict[str, Path] = {}
        self.errors: dict[str, str] = {}

    def _url(self) -> str:
        argv = procs.read_records(self.state_dir / "pids")["kube-scheduler"].argv
        port = next(a.split("=", 1)[1] for a in argv if a.startswith("--secure-port="))
        return f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={self.seconds}"

    def _fetch(self, label: str) -> None:
        path = self.out_dir / f"{label}.pb.gz"
        try:
            with urllib.request.urlopen(self._url(), context=self.context, timeout=self.seconds + 30) as resp:
                path.write_bytes(resp.read())
            self.profiles[label] = path
        except OSError as err:
            self.errors[label] = str(err)

    @contextlib.contextmanager
    def during(self, label: str) -> Iterator[None]:
        """Profile kube-scheduler for ``seconds`` from now; the block should end within them."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        thread = threading.Thread(target=self._fetch, args=(label,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join(timeout=self.seconds + 60)


def top(profile: Path, *, cumulative: bool = False, lines: int = 18) -> str:
    """``go tool pprof -top`` of ``profile`` (the header and the first ``lines`` functions)."""
    go = shutil.which("go")
    if go is None:
        return "(go not on PATH: `go tool pprof -top` unavailable)"
    argv = [go, "tool", "pprof", "-top", f"-nodecount={lines}", *(["-cum"] if cumulative else []), str(profile)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        return f"(go tool pprof failed: {done.stderr.strip()[-400:]})"
    return done.stdout.rstrip()


FRAMES: tuple[tuple[str, str], ...] = (
    ("DRA Filter, all of it", "dynamicresources.(*DynamicResources).Filter"),
    ("  the allocator (Allocate)", ").Allocate"),
    ("    pools gathered from the node's slices (GatherPools)", ".GatherPools"),
    ("      slices converted v1 -> internal", "Convert_v1_ResourceSlice_To_api_ResourceSlice"),
    ("      counter consumption validated", ".validateDeviceCounterConsumption"),
    ("    device selectors (CEL)", ").selectorsMatch"),
    ("    counters checked", ").checkAvailableCounters"),
    ("    allocated-device lookups", ".IsDeviceAllocated"),
    ("    matchAttribute constraints", "(*matchAttributeConstraint)."),
    ("DRA PreFilter", "dynamicresources.(*DynamicResources).PreFilter"),
    ("DRA PreBind", "dynamicresources.(*DynamicResources).PreBind"),
    ("memory allocation (mallocgc)", "runtime.mallocgc"),
    ("garbage collector (background mark)", "runtime.gcBgMarkWorker"),
)
"""(what, a substring of the Go function) for the breakdown; the largest cumulative match counts."""


def _cum(profile: Path) -> tuple[float, list[tuple[float, str]]]:
    """(total ms, [(cumulative ms, function)]) from ``go tool pprof -top -cum``."""
    text = top(profile, cumulative=True, lines=600)
    total = 0.0
    rows: list[tuple[float, str]] = []
    for line in text.splitlines():
        if "Total samples =" in line:
            total = _ms(line.split("Total samples =", 1)[1].split()[0])
            continue
        fields = line.split()
        if len(fields) >= 6 and fields[1].endswith("%") and fields[4].endswith("%"):
            rows.append((_ms(fields[3]), " ".join(fields[5:])))
    return total, rows


def _ms(text: str) -> float:
    for unit, factor in (("ms", 1.0), ("us", 0.001), ("s", 1000.0)):
        if text.endswith(unit):
            try:
                return float(text[: -len(unit)]) * factor
            except ValueError:
                return 0.0
    return 0.0


def breakdown(profile: Path) -> tuple[float, list[tuple[str, float]]]:
    """(total CPU ms, [(what, cumulative ms)]) for :data:`FRAMES`."""
    total, rows = _cum(profile)
    out = [(what, max((ms for ms, fn in rows if frame in fn), default=0.0)) for what, frame in FRAMES]
    return total, out


def report(profiler: SchedulerProfiler) -> str:
    """Markdown: a table of where the CPU went per profiled round, then each round's flat top functions."""
    labels = list(profiler.profiles)
    if not labels:
        return "(no profile taken)" + "".join(f"; {k}: {v}" for k, v in profiler.errors.items())
    columns = {label: breakdown(profiler.profiles[label]) for label in labels}
    head = "| where (cumulative) | " + " | ".join(labels) + " |"
    lines = [head, "|---|" + "---|" * len(labels)]
    totals = " | ".join(f"{columns[label][0]:.0f} ms" for label in labels)
    lines.append(f"| kube-scheduler CPU in the profile | {totals} |")
    for index, (what, _) in enumerate(FRAMES):
        cells = []
        for label in labels:
            total, rows = columns[label]
            ms = rows[index][1]
            cells.append(f"{ms:.0f} ms ({100 * ms / total:.0f} %)" if total else "-")
        lines.append(f"| {what.replace(' ', '&nbsp;', len(what) - len(what.lstrip()))} | " + " | ".join(cells) + " |")
    parts = ["\n".join(lines), ""]
    for label in labels:
        path = profiler.profiles[label]
        parts.append(f"**{label}**, flat (`{path}`):\n\n```text\n{top(path, lines=12)}\n```\n")
    parts += [f"**{label}**: no profile ({why})\n" for label, why in profiler.errors.items()]
    return "\n".join(parts)
