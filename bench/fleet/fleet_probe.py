"""Read-only probes of a running loopback cluster for the fleet benchmark: metrics, processes, etcd.

* ``Probe(state_dir, kubeconfig)`` finds every component through its pidfile (``e2e.cluster.procs``
  records the argv, so the scheduler's secure port and etcd's client URL come from there) and
  scrapes ``/metrics`` of kube-scheduler, kube-apiserver (admin client certificate) and etcd.
* ``Metrics`` is one scrape (prometheus text, parsed by ``prometheus_client``); ``minus`` gives
  the difference of two scrapes, ``histogram_quantile`` a quantile of a histogram difference
  (linear inside a bucket, as PromQL's ``histogram_quantile`` does).
* ``rss_mb`` / ``cpu_s`` read ``/proc/<pid>/status`` and ``/proc/<pid>/stat``.
* ``etcd_prefix_bytes`` reads etcd's keys under a prefix through its JSON gateway
  (``/v3/kv/range``, paged) and sums key and value sizes: the bytes etcd stores for them.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import os
import platform
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import yaml
from prometheus_client import parser

from e2e.cluster import procs

Labels = frozenset[tuple[str, str]]
TICK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Metrics:
    """One scrape: (sample name, labels) -> value."""

    samples: Mapping[tuple[str, Labels], float]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        """Parse prometheus text exposition."""
        out: dict[tuple[str, Labels], float] = {}
        for family in parser.text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = float(s.value)
        return cls(out)

    def minus(self, earlier: Metrics) -> Metrics:
        """What grew between ``earlier`` and this scrape (counters and histograms)."""
        return Metrics({k: v - earlier.samples.get(k, 0.0) for k, v in self.samples.items()})

    def select(self, name: str, **labels: str) -> dict[Labels, float]:
        """Samples called ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return {lab: v for (n, lab), v in self.samples.items() if n == name and want <= lab}

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` with ``labels``."""
        return sum(self.select(name, **labels).values())

    def histogram_quantile(self, name: str, q: float, **labels: str) -> float | None:
        """Quantile ``q`` of histogram ``name`` (its ``_bucket`` samples summed over other labels)."""
        buckets: dict[float, float] = {}
        for lab, value in self.select(f"{name}_bucket", **labels).items():
            le = dict(lab)["le"]
            bound = math.inf if le in ("+Inf", "inf") else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + value
        if not buckets:
            return None
        ordered = sorted(buckets.items())
        count = ordered[-1][1]
        if count <= 0:
            return None
        rank = q * count
        lower, below = 0.0, 0.0
        for bound, cumulative in ordered:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower  # above the highest finite bucket: its bound is all we know
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, cumulative
        return lower

    def histogram_count(self, name: str, **labels: str) -> float:
        """Observations in histogram ``name``."""
        return self.total(f"{name}_count", **labels)

    def histogram_mean(self, name: str, **labels: str) -> float | None:
        """Mean observation of histogram ``name``."""
        count = self.histogram_count(name, **labels)
        return self.total(f"{name}_sum", **labels) / count if count else None


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (0 when it is gone)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0 when it is gone)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    return 0.0


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (all CPUs; idle and iowait left out)."""
    with contextlib.suppress(OSError, ValueError):
        jiffies = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return (sum(jiffies) - jiffies[3] - jiffies[4]) / TICK
    return 0.0


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` ("unknown CPU" when it is not there)."""
    with contextlib.suppress(OSError, StopIteration):
        return next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return "unknown CPU"


def memory_kb() -> int | None:
    """The machine's memory (``/proc/meminfo`` MemTotal), None where it cannot be read."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        lines = Path("/proc/meminfo").read_text().splitlines()
        return next(int(line.split()[1]) for line in lines if line.startswith("MemTotal"))
    return None


def apiserver_memlimit(choice: str) -> str | None:
    """kube-apiserver's GOMEMLIMIT: ``off`` none, ``auto`` half the machine's memory, else the value as given."""
    if choice == "off":
        return None
    if choice != "auto":
        return choice
    kb = memory_kb()
    return None if kb is None else f"{kb // 2 // 1024}MiB"


def machine() -> str:
    """CPU model, CPU count, memory and Python version."""
    cpu = cpu_model()
    kb = memory_kb()
    mem = "?" if kb is None else f"{kb / 2**20:.0f} GiB"
    return f"{os.cpu_count()} CPUs ({cpu}), {mem} memory, Python {platform.python_version()}, {platform.system()}"


def load_average() -> str:
    """``/proc/loadavg``'s three load averages."""
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def _flag(argv: Iterable[str], name: str) -> str | None:
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in argv if a.startswith(prefix)), None)


class Probe:
    """The components of one state directory and their metrics endpoints."""

    def __init__(self, state_dir: Path, kubeconfig: Path) -> None:
        self.state_dir = state_dir
        cfg = yaml.safe_load(kubeconfig.read_text())
        self.server = str(cfg["clusters"][0]["cluster"]["server"])
        pki = state_dir / "pki"
        self._tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self._tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self._insecure = ssl.create_default_context()
        self._insecure.check_hostname = False
        self._insecure.verify_mode = ssl.CERT_NONE
        self._insecure.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.extra_pids: dict[str, int] = {}

    def records(self) -> dict[str, procs.ProcessRecord]:
        """Pidfile records of every component that runs now."""
        return {n: r for n, r in procs.read_records(self.state_dir / "pids").items() if procs.is_alive(r)}

    def pids(self) -> dict[str, int]:
        """Component name -> pid (pidfile components plus ``extra_pids``)."""
        return {**{n: r.pid for n, r in self.records().items()}, **self.extra_pids}

    def _argv(self, component: str) -> tuple[str, ...]:
        record = procs.read_records(self.state_dir / "pids").get(component)
        if record is None:
            raise RuntimeError(f"no pidfile for {component} in {self.state_dir / 'pids'}")
        return record.argv

    def _get(self, url: str, context: ssl.SSLContext | None, timeout: float = 60.0) -> bytes:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            data: bytes = response.read()
        return data

    def scheduler(self) -> Metrics:
        """kube-scheduler's /metrics (its secure port, admin certificate)."""
        port = _flag(self._argv("kube-scheduler"), "secure-port")
        return Metrics.parse(self._get(f"https://127.0.0.1:{port}/metrics", self._insecure).decode())

    def apiserver(self) -> Metrics:
        """kube-apiserver's /metrics."""
        return Metrics.parse(self._get(f"{self.server}/metrics", self._tls).decode())

    def etcd_url(self) -> str:
        """etcd's client URL."""
        url = _flag(self._argv("etcd"), "listen-client-urls")
        if url is None:
            raise RuntimeError("etcd's pidfile has no --listen-client-urls")
        return url.split(",")[0]

    def etcd(self) -> Metrics:
        """etcd's /metrics."""
        return Metrics.parse(self._get(f"{self.etcd_url()}/metrics", None).decode())

    def etcd_prefix_bytes(self, prefix: str, page: int = 200) -> tuple[int, int]:
        """(keys, bytes of keys + values) etcd stores under ``prefix`` (read in pages)."""
        start = prefix.encode()
        end = prefix[:-1].encode() + bytes([prefix.encode()[-1] + 1])
        keys = total = 0
        key = start
        while True:
            body = json.dumps(
                {
                    "key": base64.b64encode(key).decode(),
                    "range_end": base64.b64encode(end).decode(),
                    "limit": page,
                }
            ).encode()
            request = urllib.request.Request(f"{self.etcd_url()}/v3/kv/range", data=body, method="POST")
            with urllib.request.urlopen(request, timeout=120) as response:
                answer = json.loads(response.read())
            kvs = answer.get("kvs") or []
            for kv in kvs:
                raw_key = base64.b64decode(kv["key"])
                total += len(raw_key) + len(base64.b64decode(kv.get("value", "")))
                keys += 1
            if not answer.get("more") or not kvs:
                return keys, total
            key = base64.b64decode(kvs[-1]["key"]) + b"\x00"


def _all_cpu() -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = (entry / "stat").read_text()
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw.rsplit(")", 1)[1].split()
            out[int(entry.name)] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def busiest(window_s: float = 3.0, top: int = 6, exclude: Iterable[int] = ()) -> list[tuple[str, float]]:
    """The processes that used the most CPU over ``window_s`` (name, CPUs busy), ``exclude`` left out."""
    skip = set(exclude)
    before = _all_cpu()
    time.sleep(window_s)
    after = _all_cpu()
    by_name: dict[str, float] = {}
    for pid, (name, used) in after.items():
        if pid in skip or pid not in before:
            continue
        by_name[name] = by_name.get(name, 0.0) + (used - before[pid][1]) / window_s
    return sorted(((n, c) for n, c in by_name.items() if c >= 0.02), key=lambda x: -x[1])[:top]


class PeakSampler:
    """Resident memory of every component of a probe, sampled in a thread: the peak per component."""

    def __init__(self, probe: Probe, every_s: float = 0.5) -> None:
        self.probe = probe
        self.every_s = every_s
        self.peaks: dict[str, float] = {}  # over the whole run
        self.step_peaks: dict[str, float] = {}  # since the component's last ``reset``
        self._above: dict[str, tuple[float, Callable[[float], None]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()

    def peak(self, name: str) -> float:
        """The highest RSS (MB) seen for ``name`` since its last ``reset``."""
        return self.step_peaks.get(name, 0.0)

    def when_above(self, name: str, mb: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(rss)`` once, in its own thread, the first time ``name`` is sampled above ``mb``."""
        self._above[name] = (mb, fn)

    def reset(self, name: str) -> None:
        """Start a new step peak for ``name`` (the run's peak is kept)."""
        self.step_peaks.pop(name, None)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(Exception):  # a component going away mid-sample
                for name, pid in self.probe.pids().items():
                    rss = rss_mb(pid)
                    self.peaks[name] = max(self.peaks.get(name, 0.0), rss)
                    self.step_peaks[name] = max(self.step_peaks.get(name, 0.0), rss)
                    if name in self._above and rss > self._above[name][0]:
                        fn = self._above.pop(name)[1]
                        threading.Thread(target=fn, args=(rss,), daemon=True).start()


def replace_scheduler(
    state_dir: Path, binary: Path, timeout: float = 120.0, gates: Mapping[str, bool] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Swap the cluster's kube-scheduler for ``binary`` with the same flags (for a newer release's allocator).

    Only the ``DRA*`` feature gates are kept (a newer release removes or renames others, and a
    gate it does not know stops it at start); ``gates`` overrides some of them. Returns the new
    process and its ``/version``. The pidfile keeps the name ``kube-scheduler``, so stopping the
    cluster stops it too.
    """
    pid_dir = state_dir / "pids"
    old = procs.read_records(pid_dir)["kube-scheduler"]
    procs.stop(old)
    argv = [str(binary)]
    for arg in old.argv[1:]:
        if arg.startswith("--feature-gates="):
            kept = dict(g.split("=", 1) for g in arg.split("=", 1)[1].split(",") if g.startswith("DRA"))
            kept |= {name: str(on).lower() for name, on in (gates or {}).items()}
            argv.append("--feature-gates=" + ",".join(f"{k}={v}" for k, v in sorted(kept.items())))
        else:
            argv.append(arg)
    proc, _ = procs.spawn("kube-scheduler", argv, log=old.log, pid_dir=pid_dir, cwd=state_dir, die_with_parent=True)
    port = _flag(argv, "secure-port")
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise procs.ComponentError("kube-scheduler", f"{binary} exited with code {proc.returncode}", old.log)
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=insecure, timeout=3) as r,
        ):
            if r.status == 200:
                break
        if time.monotonic() > deadline:
            raise procs.ComponentError("kube-scheduler", f"{binary} not healthy after {timeout:.0f}s", old.log)
        time.sleep(0.5)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return proc, version
