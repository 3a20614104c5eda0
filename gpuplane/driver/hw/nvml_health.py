"""Health events and samples through NVML: Xid and ECC events from an event set, per-GPU telemetry.

:meth:`NvmlHealth.wait_health_events` waits in short slices under the session lock, so other
calls are not starved; :meth:`NvmlHealth.sample` reads utilization, memory, temperature, power,
clocks-event reasons and ECC counts. Reads only (the event set is registered once).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gpuplane.driver.hw.interface import DeviceSample, HealthEvent, HealthEventKind
from gpuplane.driver.hw.nvml_session import NvmlSession, text

# Health events this backend subscribes to (nvmlEventType*).
_EVENT_SBE = 0x1
_EVENT_DBE = 0x2
_EVENT_XID = 0x8


class NvmlHealth(NvmlSession):
    """The health and telemetry half of :class:`~gpuplane.driver.hw.nvml.NvmlBackend`."""

    _event_set: Any
    _event_slice_s: float

    def _ensure_event_set(self) -> Any:
        n = self._nvml
        if self._event_set is None:
            es = n.nvmlEventSetCreate()
            wanted = _EVENT_XID | _EVENT_DBE | _EVENT_SBE
            for index in range(int(n.nvmlDeviceGetCount())):
                h = n.nvmlDeviceGetHandleByIndex(index)
                supported = self._try(n.nvmlDeviceGetSupportedEventTypes, h, default=wanted)
                mask = int(supported) & wanted
                if mask:
                    self._try(n.nvmlDeviceRegisterEvents, h, mask, es)
            self._event_set = es
        return self._event_set

    def _to_event(self, data: Any) -> HealthEvent | None:
        n = self._nvml
        et = int(data.eventType)
        uuid = text(n.nvmlDeviceGetUUID(data.device))
        now = time.time()
        if et & _EVENT_XID:
            xid = int(data.eventData)
            return HealthEvent(uuid=uuid, kind=HealthEventKind.XID, xid=xid, message=f"Xid {xid}", timestamp=now)
        if et & _EVENT_DBE:
            return HealthEvent(uuid=uuid, kind=HealthEventKind.ECC_DOUBLE_BIT, message="double-bit ECC", timestamp=now)
        if et & _EVENT_SBE:
            return HealthEvent(uuid=uuid, kind=HealthEventKind.ECC_SINGLE_BIT, message="single-bit ECC", timestamp=now)
        return None

    def wait_health_events(self, timeout_s: float) -> Sequence[HealthEvent]:
        """Xid and ECC events from NVML's event set. Waits in short slices so other calls are not starved."""
        n = self._nvml
        deadline = time.monotonic() + max(0.0, timeout_s)
        events: list[HealthEvent] = []
        while True:
            remaining = deadline - time.monotonic()
            slice_ms = 0 if events else int(max(0.0, min(self._event_slice_s, remaining)) * 1000)
            with self._guard():
                es = self._ensure_event_set()
                try:
                    data = n.nvmlEventSetWait_v2(es, slice_ms)
                except n.NVMLError as e:
                    if getattr(e, "value", None) != self._const("NVML_ERROR_TIMEOUT", 10):
                        raise
                    data = None
                if data is not None:
                    ev = self._to_event(data)
                    if ev is not None:
                        events.append(ev)
                    continue  # drain whatever else is queued
            if events or remaining <= 0:
                return tuple(events)

    def sample(self, uuid: str) -> DeviceSample:
        n = self._nvml
        with self._guard():
            h = self._handle(uuid)
            util = self._try(n.nvmlDeviceGetUtilizationRates, h)
            mem = self._try(n.nvmlDeviceGetMemoryInfo, h)
            temp = self._try(n.nvmlDeviceGetTemperature, h, self._const("NVML_TEMPERATURE_GPU", 0), default=0)
            power_mw = self._try(n.nvmlDeviceGetPowerUsage, h, default=0)
            reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            if reasons_fn is None:  # nvidia-ml-py before the 'event reasons' rename
                reasons_fn = n.nvmlDeviceGetCurrentClocksThrottleReasons
            reasons = self._try(reasons_fn, h, default=0)
            corrected = self._const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
            uncorrected = self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
            volatile = self._const("NVML_VOLATILE_ECC", 0)
            sbe = self._try(n.nvmlDeviceGetTotalEccErrors, h, corrected, volatile, default=0)
            dbe = self._try(n.nvmlDeviceGetTotalEccErrors, h, uncorrected, volatile, default=0)
            return DeviceSample(
                uuid=uuid,
                # NVML's utilization is "kernel running" time, a coarse stand-in for DCGM's SM active.
                sm_active=(int(util.gpu) / 100.0) if util is not None else 0.0,
                memory_used_bytes=int(mem.used) if mem is not None else 0,
                memory_bandwidth_util=(int(util.memory) / 100.0) if util is not None else 0.0,
                temperature_c=float(temp),
                power_w=float(power_mw) / 1000.0,
                throttle_reasons=int(reasons),
                ecc_sbe_total=int(sbe),
                ecc_dbe_total=int(dbe),
            )
