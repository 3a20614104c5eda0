"""The telemetry metric families: names, labels, the collector that serves them, and how they are built.

The device gauges keep **dcgm-exporter's names exactly** (``DCGM_FI_DEV_GPU_TEMP``, ...) and its
label names where they exist (``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``,
``GPU_I_PROFILE``, ``namespace``), so NVIDIA's Grafana dashboards and existing alert rules work
unchanged; a ``job`` label tells them apart from a real dcgm-exporter. gpuplane adds
``dra_device`` (the DRA device name), ``claim`` and ``tier``. A device held by several claims
(MPS, time-slicing) gets one series per claim with the same device values, as dcgm-exporter does
for shared GPUs; an unheld device one series with empty claim labels. For MIG holders the values
are the parent GPU's (the backend samples physical GPUs only). Claim-level metrics are
``gpuplane_*``.

:func:`device_families` and :func:`fraction_family` are pure (samples and holdings in, families
out); :class:`TelemetryMetrics` registers the collector and the counters on a registry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.inventory import Inventory
from gpuplane.driver.observe import cost
from gpuplane.driver.prepare.checkpoint import ClaimRecord

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


def device_families(
    inv: Inventory,
    samples: Mapping[str, hw.DeviceSample],
    by_gpu: Mapping[str, Sequence[cost.Holding]],
    records: Mapping[str, ClaimRecord],
    host: str,
) -> list[Metric]:
    """The DCGM-named device gauges (one series per holder) and the decoded clocks-event reasons."""
    fams = [GaugeMetricFamily(name, doc, labels=DEVICE_LABELS) for name, doc, _ in DEVICE_GAUGES]
    reasons = GaugeMetricFamily(
        "gpuplane_clocks_event_reason",
        "1 while the GPU's clocks are held back for this reason (decoded DCGM_FI_DEV_CLOCKS_EVENT_REASONS)",
        labels=("gpu", "UUID", "Hostname", "reason"),
    )
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


def fraction_family(inv: Inventory, by_gpu: Mapping[str, Sequence[cost.Holding]], host: str) -> Metric:
    """``gpuplane_claim_device_fraction``: the fraction of each physical GPU each claim holds."""
    fraction = GaugeMetricFamily(
        "gpuplane_claim_device_fraction",
        "Fraction of the physical GPU the claim holds (the cost basis: 1, MIG memory slices/8, MPS SM quota)",
        labels=CLAIM_LABELS,
    )
    for gpu in inv.gpus:
        for h in by_gpu.get(gpu.info.uuid) or []:
            fraction.add_metric([host, str(gpu.info.minor), h.device, h.name, h.namespace, h.tier], h.fraction)
    return fraction


def _mig_profile(rec: ClaimRecord | None, device: str) -> str:
    if rec is None:
        return ""
    for d in rec.devices:
        if d.device == device and d.mig is not None:
            return d.mig.profile_name
    return ""
