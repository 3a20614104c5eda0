"""Per-device and per-claim telemetry, the noisy-neighbour signal and cost ticks, on one sampler thread.

Every ``interval_s`` the :class:`TelemetrySampler`

1. samples every GPU through the hardware boundary (``GpuBackend.sample``);
2. reads what is held from the checkpoint (:func:`gpuplane.driver.observe.cost.holdings`), with
   each claim's tier (:mod:`gpuplane.driver.observe.tiers`);
3. rebuilds the metric families that the collector serves on ``/metrics``
   (:mod:`gpuplane.driver.observe.telemetry_metrics`: dcgm-exporter's names and labels);
4. feeds the :class:`~gpuplane.driver.observe.noisy_watch.NoisyWatch` (per-claim memory-bandwidth
   shares on MPS-shared GPUs; alerts become Events and counters);
5. ticks the :class:`~gpuplane.driver.observe.cost.CostAccountant`.

Side effects: one daemon thread; reads the hardware and the checkpoint; replaces the served
families; through the watch and the accountant, Events, counters and the cost ledger.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from gpuplane.driver.hw import interface as hw
from gpuplane.driver.inventory import Inventory
from gpuplane.driver.observe import cost, noisy
from gpuplane.driver.observe.attribution import parent_pid
from gpuplane.driver.observe.noisy_watch import EventSink, NoisyWatch
from gpuplane.driver.observe.telemetry_metrics import TelemetryMetrics, device_families, fraction_family
from gpuplane.driver.observe.tiers import TierResolver
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord

log = structlog.get_logger(__name__)


@dataclass
class TelemetrySettings:
    interval_s: float = 10.0
    hostname: str = ""
    noisy: noisy.NoisySettings = field(default_factory=noisy.NoisySettings)


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
        self.accountant = accountant
        self.clock = clock
        self.noisy = NoisyWatch(settings.noisy, metrics, daemon_pids=daemon_pids, parent_of=parent_of, events=events)
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
        host = self.settings.hostname or inv.node_name
        families = device_families(inv, samples, by_gpu, records, host)
        families.append(fraction_family(inv, by_gpu, host))
        transitions, noisy_families = self.noisy.observe(inv, samples, by_gpu, host, now)
        families.extend(noisy_families)
        self.metrics.collector.set(families)
        if self.accountant is not None:
            self.accountant.tick(held, now)
        return transitions
