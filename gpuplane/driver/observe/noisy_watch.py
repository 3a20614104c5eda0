"""The noisy-neighbour watch: per-claim memory-bandwidth shares on MPS-shared GPUs, alerts, Events.

Each tick, for every GPU with MPS holders, :class:`NoisyWatch` attributes the per-process
bandwidth samples to claims (:mod:`gpuplane.driver.observe.attribution`), feeds the shares to the
:class:`~gpuplane.driver.observe.noisy.NoisyNeighbourDetector` and announces what changed: a
raised alert is logged, counted (``gpuplane_noisy_neighbour_events``) and becomes a Warning Event
on the hog's ResourceClaim and on each higher-tier claim; a cleared one a Normal Event on each.

Side effects: Events through the sink (API writes), counter increments, log lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.inventory import Inventory
from gpuplane.driver.observe import cost, noisy
from gpuplane.driver.observe.attribution import attribute, claim_shares
from gpuplane.driver.observe.telemetry_metrics import CLAIM_LABELS, TelemetryMetrics

log = structlog.get_logger(__name__)


class EventSink(Protocol):
    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None: ...


def _claim_obj(t: noisy.Tenant) -> dict[str, Any]:
    return {"metadata": {"namespace": t.namespace, "name": t.name, "uid": t.claim_uid}}


class NoisyWatch:
    """The detector, fed once per tick, and the announcements of its transitions."""

    def __init__(
        self,
        settings: noisy.NoisySettings,
        metrics: TelemetryMetrics,
        *,
        daemon_pids: Callable[[], Mapping[int, str]],
        parent_of: Callable[[int], int | None],
        events: EventSink | None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.daemon_pids = daemon_pids
        self.parent_of = parent_of
        self.events = events
        self.detector = noisy.NoisyNeighbourDetector(settings)

    def observe(
        self,
        inv: Inventory,
        samples: Mapping[str, hw.DeviceSample],
        by_gpu: Mapping[str, Sequence[cost.Holding]],
        host: str,
        now: float,
    ) -> tuple[list[noisy.Transition], list[Metric]]:
        """Update the detector from this tick's samples; the transitions, and the share and alert gauges."""
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
        return transitions, [share, active]

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
        th = f"{self.settings.threshold * 100:.0f}%"
        if tr.raised:
            self.events.claim_event(
                _claim_obj(a.hog),
                "NoisyNeighbour",
                f"claim uses {pct} of the memory bandwidth of {a.gpu} (threshold {th}, sustained "
                f"{self.settings.sustain_s:.0f}s) while higher-tier claims share it over MPS: {victims}",
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
