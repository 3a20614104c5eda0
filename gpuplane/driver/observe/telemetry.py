"""Per-device and per-claim telemetry, the noisy-neighbour signal and cost ticks, on one sampler thread.

Every ``interval_s`` the :class:`TelemetrySampler`

1. samples every GPU through the hardware boundary (``GpuBackend.sample``);
2. reads what is held from the checkpoint (:func:`gpuplane.driver.observe.cost.holdings`), with each claim's tier;
3. rebuilds the metric families that :class:`TelemetryCollector` serves on ``/metrics``;
4. attributes per-process memory-bandwidth samples to MPS claims and feeds the
   :class:`~gpuplane.driver.observe.noisy.NoisyNeighbourDetector`; a raised alert becomes a Warning Event on the
   hog's ResourceClaim and on each higher-tier claim, plus a counter;
5. ticks the :class:`~gpuplane.driver.observe.cost.CostAccountant`.

Metric names: the device gauges keep **dcgm-exporter's names exactly** (``DCGM_FI_DEV_GPU_TEMP``,
...) and its label names where they exist (``gpu``, ``UUID``, ``device``, ``modelName``,
``Hostname``, ``GPU_I_PROFILE``, ``namespace``), so NVIDIA's Grafana dashboards and existing alert
rules work unchanged; a ``job`` label tells them apart from a real dcgm-exporter. gpuplane adds
``dra_device`` (the DRA device name), ``claim`` and ``tier``. A device held by several claims (MPS,
time-slicing) gets one series per claim with the same device values, as dcgm-exporter does for
shared GPUs; an unheld device one series with empty claim labels. For MIG holders the values are
the parent GPU's (the backend samples physical GPUs only). Claim-level metrics are ``gpuplane_*``.

Tier of a claim: for MPS, the tier named by its device class (``mps-<tier>.<domain>``, the
convention of manifests/deviceclasses, or ``class_tiers`` given explicitly); otherwise by how the
device is held (``whole``, ``mig``, ``timeslicing``; ``mps`` for an MPS class without a tier).

Which claim a GPU process belongs to (for per-claim bandwidth): the claim whose MPS control daemon
is the process or one of its ancestors (the MPS server is the control daemon's child). Processes
that cannot be attributed count for nobody.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuplane.driver.host import PROC, proc_stat
from gpuplane.driver.hw import interface as hw
from gpuplane.driver.observe import cost, noisy
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord
from gpuplane.driver.publish.inventory import Inventory

log = structlog.get_logger(__name__)

MIB = 1024 * 1024

# (metric name, help, DeviceSample -> value)
DEVICE_GAUGES: tuple[tuple[str, str, Callable[[hw.DeviceSample], float]], ...] = (
    ("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least one warp assigned (0..1).", lambda s: s.sm_active),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda s: s.memory_used_bytes / MIB),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active (memory bandwidth utilisation, 0..1).",
        lambda s: s.memory_bandwidth_util,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: s.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: s.power_w),
    (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clocks event (throttle) reasons, NVML bitmask.",
        lambda s: float(s.throttle_reasons),
    ),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total single-bit volatile ECC errors.", lambda s: float(s.ecc_sbe_total)),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total double-bit volatile ECC errors.", lambda s: float(s.ecc_dbe_total)),
)
DEVICE_LABELS = (
    "gpu",
    "UUID",
    "device",
    "modelName",
    "Hostname",
    "dra_device",
    "GPU_I_PROFILE",
    "claim",
    "namespace",
    "tier",
)
CLAIM_LABELS = ("Hostname", "gpu", "dra_device", "claim", "namespace", "tier")

# NVML clocks-event reasons, decoded into gpuplane_clocks_event_reason{reason}.
THROTTLE_REASONS: Mapping[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


# --- tiers -------------------------------------------------------------------------------------

_TIER_CLASS = re.compile(r"^mps-([a-z0-9-]+)\.")


class ClaimReader(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...


def class_names(claim: Mapping[str, Any]) -> list[str]:
    """Device class names a ResourceClaim's requests name (``exactly`` and ``firstAvailable``)."""
    out: list[str] = []
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = req.get("exactly") or {}
        if exactly.get("deviceClassName"):
            out.append(str(exactly["deviceClassName"]))
        out.extend(str(sub["deviceClassName"]) for sub in req.get("firstAvailable") or [] if sub.get("deviceClassName"))
    return out


def tier_from_classes(names: Iterable[str], class_tiers: Mapping[str, str]) -> str | None:
    for name in names:
        if name in class_tiers:
            return class_tiers[name]
        m = _TIER_CLASS.match(name)
        if m:
            return m.group(1)
    return None


class TierResolver:
    """Claim record -> tier; reads each MPS claim once from the API (claims' specs are immutable)."""

    def __init__(self, claims: ClaimReader | None, class_tiers: Mapping[str, str] | None = None) -> None:
        self.claims = claims
        self.class_tiers = dict(class_tiers or {})
        self._cache: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, rec: ClaimRecord) -> str:
        base = cost.default_tier(rec)
        if base != cost.TIER_MPS or self.claims is None:
            return base
        with self._lock:
            if rec.uid in self._cache:
                return self._cache[rec.uid]
        try:
            obj = self.claims.get_claim(rec.namespace, rec.name)
        except Exception as exc:  # not cached: retried on the next tick
            log.debug("tier lookup failed", claim=f"{rec.namespace}/{rec.name}", error=str(exc))
            return base
        if (obj.get("metadata") or {}).get("uid") != rec.uid:
            return base
        tier = tier_from_classes(class_names(obj), self.class_tiers) or base
        with self._lock:
            self._cache[rec.uid] = tier
        return tier

    def forget(self, keep: Iterable[str]) -> None:
        keep_set = set(keep)
        with self._lock:
            for uid in [u for u in self._cache if u not in keep_set]:
                del self._cache[uid]


# --- process attribution -----------------------------------------------------------------------


def parent_pid(pid: int, proc: Path = PROC) -> int | None:
    """The parent of ``pid`` from /proc/<pid>/stat (None when gone)."""
    stat = proc_stat(pid, proc)
    return None if stat is None else stat.ppid


def attribute(
    pids: Iterable[int], daemon_pids: Mapping[int, str], parent_of: Callable[[int], int | None], max_depth: int = 8
) -> dict[int, str]:
    """pid -> claim uid for processes that are a claim's MPS daemon or descend from it."""
    out: dict[int, str] = {}
    for pid in pids:
        cur: int | None = pid
        for _ in range(max_depth):
            if cur is None or cur <= 1:
                break
            if cur in daemon_pids:
                out[pid] = daemon_pids[cur]
                break
            cur = parent_of(cur)
    return out


def claim_shares(per_process: Mapping[int, float], owner: Mapping[int, str]) -> dict[str, float]:
    shares: dict[str, float] = {}
    for pid, value in per_process.items():
        uid = owner.get(pid)
        if uid is not None:
            shares[uid] = shares.get(uid, 0.0) + value
    return shares


# --- the collector ----------------------------------------------------------------------------


class TelemetryCollector(Collector):
    """Serves the latest families built by the sampler (no stale series: each tick replaces all)."""

    def __init__(self) -> None:
        self._families: list[Metric] = []
        self._lock = threading.Lock()

    def set(self, families: list[Metric]) -> None:
        with self._lock:
            self._families = families

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            return list(self._families)


class TelemetryMetrics:
    """The collector plus the counters (noisy-neighbour alerts, GPU-seconds) on one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.collector = TelemetryCollector()
        registry.register(self.collector)
        self.noisy_events = Counter(
            "gpuplane_noisy_neighbour_events",
            "Noisy-neighbour alerts raised, by the claim's role (hog or victim), namespace and tier",
            ["role", "namespace", "tier"],
            registry=registry,
        )
        self.gpu_seconds = Counter(
            "gpuplane_gpu_seconds",
            "GPU time held: fraction of the device x wall seconds, by namespace, tier and kind",
            ["namespace", "tier", "kind"],
            registry=registry,
        )

    def charge(self, namespace: str, tier: str, kind: str, gpu_seconds: float) -> None:
        self.gpu_seconds.labels(namespace, tier, kind).inc(gpu_seconds)


# --- the sampler -------------------------------------------------------------------------------


class EventSink(Protocol):
    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None: ...


@dataclass
class TelemetrySettings:
    interval_s: float = 10.0
    hostname: str = ""
    noisy: noisy.NoisySettings = field(default_factory=noisy.NoisySettings)


def _claim_obj(t: noisy.Tenant) -> dict[str, Any]:
    return {"metadata": {"namespace": t.namespace, "name": t.name, "uid": t.claim_uid}}


class TelemetrySampler:
    """The periodic sampler thread (see the module doc)."""

    def __init__(
        self,
        backend: hw.GpuBackend,
        settings: TelemetrySettings,
        metrics: TelemetryMetrics,
        *,
        inventory: Callable[[], Inventory],
        checkpoint: Callable[[], Checkpoint],
        tiers: Callable[[ClaimRecord], str],
        daemon_pids: Callable[[], Mapping[int, str]] = dict,
        parent_of: Callable[[int], int | None] = parent_pid,
        events: EventSink | None = None,
        accountant: cost.CostAccountant | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.inventory = inventory
        self.checkpoint = checkpoint
        self.tiers = tiers
        self.daemon_pids = daemon_pids
        self.parent_of = parent_of
        self.events = events
        self.accountant = accountant
        self.clock = clock
        self.detector = noisy.NoisyNeighbourDetector(settings.noisy)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.accountant is not None:
            self.accountant.flush()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("telemetry tick failed; retrying")
            self._stop.wait(self.settings.interval_s)

    def tick(self) -> list[noisy.Transition]:
        """One sampling round. Returns the noisy-neighbour transitions it produced."""
        now = self.clock()
        inv = self.inventory()
        cp = self.checkpoint()
        held = cost.holdings(cp, self.tiers)
        if isinstance(self.tiers, TierResolver):
            self.tiers.forget(cp.claims)
        samples: dict[str, hw.DeviceSample] = {}
        for gpu in inv.gpus:
            try:
                samples[gpu.info.uuid] = self.backend.sample(gpu.info.uuid)
            except hw.HardwareError as exc:
                log.debug("telemetry sample failed", gpu=gpu.name, error=str(exc))
        by_gpu: dict[str, list[cost.Holding]] = {}
        for h in held:
            by_gpu.setdefault(h.gpu_uuid, []).append(h)
        records = {r.uid: r for r in cp.claims.values()}
        families = self._device_families(inv, samples, by_gpu, records)
        transitions, claim_families = self._claims(inv, samples, by_gpu, now)
        families.extend(claim_families)
        self.metrics.collector.set(families)
        if self.accountant is not None:
            self.accountant.tick(held, now)
        return transitions

    # -- device gauges --
    def _device_families(
        self,
        inv: Inventory,
        samples: Mapping[str, hw.DeviceSample],
        by_gpu: Mapping[str, Sequence[cost.Holding]],
        records: Mapping[str, ClaimRecord],
    ) -> list[Metric]:
        fams = [GaugeMetricFamily(name, doc, labels=DEVICE_LABELS) for name, doc, _ in DEVICE_GAUGES]
        reasons = GaugeMetricFamily(
            "gpuplane_clocks_event_reason",
            "1 while the GPU's clocks are held back for this reason (decoded DCGM_FI_DEV_CLOCKS_EVENT_REASONS)",
            labels=("gpu", "UUID", "Hostname", "reason"),
        )
        host = self.settings.hostname or inv.node_name
        for gpu in inv.gpus:
            s = samples.get(gpu.info.uuid)
            if s is None:
                continue
            base = [str(gpu.info.minor), gpu.info.uuid, f"nvidia{gpu.info.minor}", gpu.info.product_name, host]
            holders = by_gpu.get(gpu.info.uuid) or []
            label_sets = [
                [*base, h.device, _mig_profile(records.get(h.claim_uid), h.device), h.name, h.namespace, h.tier]
                for h in holders
            ] or [[*base, gpu.name, "", "", "", ""]]
            for fam, (_, _, value) in zip(fams, DEVICE_GAUGES, strict=True):
                v = value(s)
                for labels in label_sets:
                    fam.add_metric(labels, v)
            for reason, bit in THROTTLE_REASONS.items():
                reasons.add_metric(
                    [str(gpu.info.minor), gpu.info.uuid, host, reason], 1.0 if s.throttle_reasons & bit else 0.0
                )
        return [*fams, reasons]

    # -- per-claim gauges and the noisy-neighbour signal --
    def _claims(
        self,
        inv: Inventory,
        samples: Mapping[str, hw.DeviceSample],
        by_gpu: Mapping[str, Sequence[cost.Holding]],
        now: float,
    ) -> tuple[list[noisy.Transition], list[Metric]]:
        host = self.settings.hostname or inv.node_name
        fraction = GaugeMetricFamily(
            "gpuplane_claim_device_fraction",
            "Fraction of the physical GPU the claim holds (the cost basis: 1, MIG memory slices/8, MPS SM quota)",
            labels=CLAIM_LABELS,
        )
        share = GaugeMetricFamily(
            "gpuplane_claim_memory_bandwidth_share",
            "The claim's share of the GPU's memory bandwidth (MPS; sum of its processes, 0..1)",
            labels=CLAIM_LABELS,
        )
        active = GaugeMetricFamily(
            "gpuplane_noisy_neighbour",
            "1 while a noisy-neighbour alert involves the claim (role hog or victim)",
            labels=(*CLAIM_LABELS, "role"),
        )
        transitions: list[noisy.Transition] = []
        daemon_pids: Mapping[int, str] | None = None
        for gpu in inv.gpus:
            holders = by_gpu.get(gpu.info.uuid) or []
            for h in holders:
                fraction.add_metric([host, str(gpu.info.minor), h.device, h.name, h.namespace, h.tier], h.fraction)
            mps = [h for h in holders if h.kind == "mps" and h.device == gpu.name]
            s = samples.get(gpu.info.uuid)
            if not mps or s is None:
                transitions.extend(self.detector.forget_gpu(gpu.name, now))
                continue
            if daemon_pids is None:
                daemon_pids = self.daemon_pids()
            owner = attribute(s.per_process_bandwidth, daemon_pids, self.parent_of)
            shares = claim_shares(s.per_process_bandwidth, owner)
            for h in mps:
                share.add_metric(
                    [host, str(gpu.info.minor), h.device, h.name, h.namespace, h.tier], shares.get(h.claim_uid, 0.0)
                )
            tenants = [noisy.Tenant(h.claim_uid, h.namespace, h.name, h.tier) for h in mps]
            transitions.extend(self.detector.update(gpu.name, tenants, shares, now))
        for tr in transitions:
            self._announce(tr)
        for alert in self.detector.active():
            minor = alert.gpu.removeprefix("gpu-")
            for role, t in [("hog", alert.hog), *(("victim", v) for v in alert.victims)]:
                active.add_metric([host, minor, alert.gpu, t.name, t.namespace, t.tier, role], 1.0)
        return transitions, [fraction, share, active]

    def _announce(self, tr: noisy.Transition) -> None:
        a = tr.alert
        victims = ", ".join(f"{v.namespace}/{v.name} ({v.tier})" for v in a.victims)
        if tr.raised:
            log.warning(
                "noisy neighbour", gpu=a.gpu, hog=f"{a.hog.namespace}/{a.hog.name}", share=a.share, victims=victims
            )
            self.metrics.noisy_events.labels("hog", a.hog.namespace, a.hog.tier).inc()
            for v in a.victims:
                self.metrics.noisy_events.labels("victim", v.namespace, v.tier).inc()
        else:
            log.info("noisy neighbour cleared", gpu=a.gpu, hog=f"{a.hog.namespace}/{a.hog.name}")
        if self.events is None:
            return
        pct = f"{a.share * 100:.0f}%"
        th = f"{self.settings.noisy.threshold * 100:.0f}%"
        if tr.raised:
            self.events.claim_event(
                _claim_obj(a.hog),
                "NoisyNeighbour",
                f"claim uses {pct} of the memory bandwidth of {a.gpu} (threshold {th}, sustained "
                f"{self.settings.noisy.sustain_s:.0f}s) while higher-tier claims share it over MPS: {victims}",
            )
            for v in a.victims:
                self.events.claim_event(
                    _claim_obj(v),
                    "NoisyNeighbour",
                    f"co-located {a.hog.tier} claim {a.hog.namespace}/{a.hog.name} uses {pct} of the memory "
                    f"bandwidth of {a.gpu} (threshold {th}); this claim may be slowed",
                )
        else:
            for t in (a.hog, *a.victims):
                self.events.claim_event(
                    _claim_obj(t),
                    "NoisyNeighbourCleared",
                    f"memory-bandwidth alert on {a.gpu} for {a.hog.namespace}/{a.hog.name} cleared",
                    warning=False,
                )


def _mig_profile(rec: ClaimRecord | None, device: str) -> str:
    if rec is None:
        return ""
    for d in rec.devices:
        if d.device == device and d.mig is not None:
            return d.mig.profile_name
    return ""
