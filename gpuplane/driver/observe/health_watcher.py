"""The health watcher thread: hardware health events and probes -> policy -> taints and health views.

Loop (every ``poll_interval_s`` at most):

1. ``backend.wait_health_events(poll_interval_s)`` -- Xid/ECC events (and the simulator's injected
   thermal, power, lost and ``CLEARED`` events);
2. probe every GPU with ``backend.sample``: throttle reasons re-observe thermal/power conditions,
   ``GPU_IS_LOST`` re-observes ``unhealthy``, a GPU that answers is recovery evidence for it;
3. let the policy drop conditions gone for ``clear_after_s``;
4. push the health views to the :class:`~gpuplane.driver.observe.health_board.HealthBoard` (the kubelet's
   ``dra-health`` stream) and, when taints changed, call ``on_change`` (main sets the publisher's
   wake event, so the ResourceSlices are rewritten with the new taints).

:meth:`HealthWatcher.taints` is the callable the :class:`~gpuplane.driver.publish.publisher.SlicePublisher` reads.
``stop`` ends the thread within one poll interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuplane.driver.host import atomic_write
from gpuplane.driver.hw import interface as hw
from gpuplane.driver.inventory import Inventory
from gpuplane.driver.observe import health
from gpuplane.driver.observe.health_board import HealthBoard
from gpuplane.driver.publish.slices import DeviceTaint

log = structlog.get_logger(__name__)


class HealthMetrics:
    """Counters of health events and a gauge per active taint."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter(
            "gpuplane_health_events_total",
            "Hardware health events seen, by kind and Xid (benign Xids included, with ignored=true)",
            ["gpu", "kind", "xid", "ignored"],
            registry=registry,
        )
        self.taints = Gauge(
            "gpuplane_device_taint",
            "1 while the GPU device carries this taint in the ResourceSlice",
            ["gpu", "key", "value", "effect"],
            registry=registry,
        )


def gpu_devices(inventory: Inventory) -> list[health.GpuDevices]:
    out = []
    for gpu in inventory.gpus:
        names = ([gpu.name] if gpu.offer_whole else []) + [s.name for s in gpu.mig_slots]
        out.append(health.GpuDevices(uuid=gpu.info.uuid, gpu_name=gpu.name, device_names=tuple(names)))
    return out


class HealthWatcher:
    """Owns the policy; one thread feeds it, any thread may read taints."""

    def __init__(
        self,
        backend: hw.GpuBackend,
        settings: health.HealthSettings,
        board: HealthBoard,
        inventory: Callable[[], Inventory],
        pool_name: str,
        *,
        on_change: Callable[[], None] = lambda: None,
        poll_interval_s: float = 1.0,
        metrics: HealthMetrics | None = None,
        clock: Callable[[], float] = time.time,
        state_file: Path | None = None,
        boot_id: str = "",
        heartbeat: Callable[[], None] = lambda: None,
    ) -> None:
        self.backend = backend
        self.heartbeat = heartbeat  # called once per pass of the watcher's loop (liveness)
        self.policy = health.HealthPolicy(settings)
        self.state_file = state_file
        self.boot_id = boot_id
        self._saved = b""
        if state_file is not None:
            self._load(state_file, clock())
        self.board = board
        self.inventory = inventory
        self.pool_name = pool_name
        self.on_change = on_change
        self.poll_interval_s = poll_interval_s
        self.metrics = metrics
        self.clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since = clock()
        self._published_taints: dict[str, tuple[DeviceTaint, ...]] = {}

    # --- persistence -------------------------------------------------------------------
    def _load(self, path: Path, now: float) -> None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        try:
            self.policy.conditions = health.decode_state(data, self.boot_id, now)
        except ValueError as exc:
            log.error("health state unreadable; starting without remembered conditions", path=str(path), error=str(exc))
            return
        self._saved = data
        if self.policy.conditions:
            log.info("remembered GPU health conditions", gpus=sorted(self.policy.conditions))

    def _save(self) -> None:
        if self.state_file is None:
            return
        data = health.encode_state(self.policy.conditions, self.boot_id)
        if data != self._saved:
            atomic_write(self.state_file, data)
            self._saved = data

    # --- reading -----------------------------------------------------------------------
    def taints(self) -> Mapping[str, Sequence[DeviceTaint]]:
        """GPU device name -> taints (for SlicePublisher)."""
        inv = self.inventory()
        with self._lock:
            return self.policy.taints({g.info.uuid: g.name for g in inv.gpus})

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.refresh_board()
        self._thread = threading.Thread(target=self._run, name="health-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.heartbeat()
            try:
                self.step(self.backend.wait_health_events(self.poll_interval_s))
            except Exception:
                log.exception("health watcher step failed; retrying")
                self._stop.wait(self.poll_interval_s)

    # --- one iteration (tests call it directly) -----------------------------------------
    def step(self, events: Sequence[hw.HealthEvent]) -> bool:
        """Apply events, probe, expire; publish. Returns True when taints changed."""
        inv = self.inventory()
        now = self.clock()
        changed = False
        with self._lock:
            for event in events:
                obs = health.classify(event, self.policy.settings)
                if self.metrics is not None:
                    name = inv.gpu_by_uuid(event.uuid)
                    self.metrics.events.labels(
                        name.name if name else event.uuid,
                        event.kind.value,
                        str(event.xid) if event.kind is hw.HealthEventKind.XID else "",
                        str(obs is None and event.kind is not hw.HealthEventKind.CLEARED).lower(),
                    ).inc()
                log.info(
                    "health event",
                    uuid=event.uuid,
                    kind=event.kind.value,
                    xid=event.xid,
                    message=event.message,
                    ignored=obs is None and event.kind is not hw.HealthEventKind.CLEARED,
                )
                changed |= self.policy.handle_event(event, now)
            for gpu in inv.gpus:
                changed |= self._probe(gpu.info.uuid, now)
            changed |= self.policy.expire(now)
            if changed:
                self._since = now
            taints = self.policy.taints({g.info.uuid: g.name for g in inv.gpus})
            views = self.policy.views(self.pool_name, gpu_devices(inv), self._since)
            self._save()
        self.board.replace(views)
        taints_changed = taints != self._published_taints
        if taints_changed:
            log.info(
                "device taints changed",
                taints={k: [f"{t.key}={t.value}:{t.effect}" for t in v] for k, v in taints.items()},
            )
            self._export_taints(taints)
            self._published_taints = taints
            self.on_change()
        return taints_changed

    def refresh_board(self) -> None:
        """Publish the views for the current inventory (start-up, or after the inventory changed)."""
        inv = self.inventory()
        with self._lock:
            views = self.policy.views(self.pool_name, gpu_devices(inv), self._since)
        self.board.replace(views)

    def _probe(self, uuid: str, now: float) -> bool:
        try:
            sample = self.backend.sample(uuid)
        except hw.HardwareError as exc:
            if exc.code is hw.ErrorCode.GPU_IS_LOST:
                return self.policy.observe(health.lost_observation(uuid, exc.message), now)
            log.debug("health probe failed", uuid=uuid, error=str(exc))
            return False
        changed = self.policy.probe_ok(uuid, now)
        for obs in health.observations_from_sample(sample):
            changed |= self.policy.observe(obs, now)
        return changed

    def _export_taints(self, taints: Mapping[str, Sequence[DeviceTaint]]) -> None:
        if self.metrics is None:
            return
        self.metrics.taints.clear()
        for gpu, ts in taints.items():
            for t in ts:
                self.metrics.taints.labels(gpu, t.key, t.value, t.effect).set(1)
