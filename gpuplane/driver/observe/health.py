"""Health policy: hardware health observations -> per-GPU conditions -> device taints and health views.

Pure: no threads, no clock, no I/O. :mod:`gpuplane.driver.observe.health_watcher` feeds it events from the
hardware boundary (``GpuBackend.wait_health_events``) and probe results (``GpuBackend.sample``),
passes ``now`` in, and publishes what it returns.

Classification (see docs/health.md):

============================  =============================  ==========  ==============
observation                   taint key                      effect      value
============================  =============================  ==========  ==============
Xid in ``fatal_xids``         ``gpu.gpuplane.dev/xid``       NoSchedule  ``xid-<n>``
other Xid, not benign         ``gpu.gpuplane.dev/xid``       None        ``xid-<n>``
benign Xid (configurable)     (ignored)
Xid 79 / GPU lost / probe     ``gpu.gpuplane.dev/unhealthy`` NoSchedule  ``fallen-off-bus``
  answers GPU_IS_LOST
double-bit ECC                ``gpu.gpuplane.dev/ecc``       NoSchedule  ``double-bit``
single-bit ECC                ``gpu.gpuplane.dev/ecc``       None        ``single-bit``
thermal throttling            ``gpu.gpuplane.dev/thermal``   None        ``throttled``
power-brake throttling        ``gpu.gpuplane.dev/power``     None        ``throttled``
============================  =============================  ==========  ==============

One condition per (GPU, key). A new observation of a key that is already active keeps the
stronger effect (a fatal Xid is not downgraded by a later informational one) and refreshes
``last_seen``.

Clearing (the rule, in full):

* An **informational** condition is gone once it has not been observed for ``clear_after_s``:
  no repeated event and no probe that still shows it (thermal throttle bits, for instance, are
  re-observed on every probe while they are set). It is dropped at ``last_seen + clear_after_s``.
* A **fatal** condition never times out on silence alone: a GPU that fell off the bus or lost
  memory does not heal by being quiet. It needs recovery evidence: a ``CLEARED`` health event for
  the GPU (the simulator emits it; an operator can inject it after a GPU reset), or, for
  ``unhealthy`` only, a probe that the GPU answers again. From that moment it must stay quiet:
  it is dropped at ``max(recovered_at, last_seen) + clear_after_s`` if not observed again after
  ``recovered_at``. Observing it again after recovery cancels the recovery.
* A ``CLEARED`` event also starts the clock for the GPU's informational conditions (they are then
  dropped ``clear_after_s`` after the later of the event and their last observation, as above).

Health views (the kubelet ``dra-health`` stream): every published device of a GPU (the whole GPU
and its MIG devices) is UNHEALTHY while the GPU has a fatal condition, otherwise HEALTHY; the
message lists the active conditions.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuplane.driver.hw.interface import DeviceSample, HealthEvent, HealthEventKind
from gpuplane.driver.observe.health_view import DeviceHealthView
from gpuplane.driver.publish.slices import DeviceTaint

TAINT_DOMAIN = "gpu.gpuplane.dev"
KEY_XID = f"{TAINT_DOMAIN}/xid"
KEY_ECC = f"{TAINT_DOMAIN}/ecc"
KEY_UNHEALTHY = f"{TAINT_DOMAIN}/unhealthy"
KEY_THERMAL = f"{TAINT_DOMAIN}/thermal"
KEY_POWER = f"{TAINT_DOMAIN}/power"

EFFECT_NO_SCHEDULE = "NoSchedule"
EFFECT_NONE = "None"

# Xids that mean the GPU (or its memory) cannot be trusted with new work. Sources: NVIDIA's Xid
# catalogue. 48 DBE, 62 internal micro-controller halt, 63/64 ECC page retirement or row
# remapping event/failure, 74 NVLink error, 79 fallen off the bus, 92 high single-bit ECC rate,
# 94/95 contained/uncontained ECC error, 119/120 GSP RPC timeout / GSP error.
DEFAULT_FATAL_XIDS: frozenset[int] = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
# Xids caused by the application, not the hardware (13 graphics engine exception, 31 MMU fault,
# 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context
# switch timeout): ignored unless an operator removes them from the list.
DEFAULT_BENIGN_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
XID_FALLEN_OFF_BUS = 79

# NVML clocks-event (throttle) reasons that mean a health condition, not normal operation.
# SW power capping (0x4) is what a busy GPU at its power limit does all day: not a condition.
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THERMAL_MASK = THROTTLE_HW_SLOWDOWN | THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL
POWER_MASK = THROTTLE_HW_POWER_BRAKE


class Severity(enum.IntEnum):
    INFO = 0
    FATAL = 1

    @property
    def effect(self) -> str:
        return EFFECT_NO_SCHEDULE if self is Severity.FATAL else EFFECT_NONE


@dataclass(frozen=True)
class HealthSettings:
    """Policy knobs, built once from the driver config."""

    clear_after_s: float = 60.0
    benign_xids: frozenset[int] = frozenset(DEFAULT_BENIGN_XIDS)
    fatal_xids: frozenset[int] = DEFAULT_FATAL_XIDS


@dataclass(frozen=True)
class Observation:
    """One classified sighting of a condition on a GPU."""

    uuid: str
    key: str
    value: str
    severity: Severity
    message: str


@dataclass(frozen=True)
class Condition:
    """An active condition of one GPU (one per taint key)."""

    key: str
    value: str
    severity: Severity
    message: str
    first_seen: float
    last_seen: float
    recovered_at: float | None = None  # recovery evidence time (fatal); None while still bad

    def expires_at(self, clear_after_s: float) -> float | None:
        """When this condition is dropped if nothing else happens; None: not while evidence lacks."""
        if self.severity is Severity.INFO:
            start = self.last_seen if self.recovered_at is None else max(self.last_seen, self.recovered_at)
            return start + clear_after_s
        if self.recovered_at is None:
            return None
        return max(self.recovered_at, self.last_seen) + clear_after_s

    def taint(self, time_added: str | None = None) -> DeviceTaint:
        return DeviceTaint(key=self.key, value=self.value, effect=self.severity.effect, time_added=time_added)


def classify(event: HealthEvent, settings: HealthSettings) -> Observation | None:
    """Map one hardware event to an observation; None for benign Xids and ``CLEARED``."""
    kind = event.kind
    msg = event.message or kind.value
    if kind is HealthEventKind.XID:
        if event.xid == XID_FALLEN_OFF_BUS:
            return Observation(event.uuid, KEY_UNHEALTHY, "fallen-off-bus", Severity.FATAL, f"Xid 79: {msg}")
        if event.xid in settings.benign_xids:
            return None
        sev = Severity.FATAL if event.xid in settings.fatal_xids else Severity.INFO
        return Observation(event.uuid, KEY_XID, f"xid-{event.xid}", sev, f"Xid {event.xid}: {msg}")
    if kind is HealthEventKind.ECC_DOUBLE_BIT:
        return Observation(event.uuid, KEY_ECC, "double-bit", Severity.FATAL, f"double-bit ECC error: {msg}")
    if kind is HealthEventKind.ECC_SINGLE_BIT:
        return Observation(event.uuid, KEY_ECC, "single-bit", Severity.INFO, f"single-bit ECC error: {msg}")
    if kind is HealthEventKind.GPU_LOST:
        return Observation(event.uuid, KEY_UNHEALTHY, "fallen-off-bus", Severity.FATAL, f"GPU lost: {msg}")
    if kind is HealthEventKind.THERMAL:
        return Observation(event.uuid, KEY_THERMAL, "throttled", Severity.INFO, f"thermal throttling: {msg}")
    if kind is HealthEventKind.POWER:
        return Observation(event.uuid, KEY_POWER, "throttled", Severity.INFO, f"power-brake throttling: {msg}")
    return None


def observations_from_sample(sample: DeviceSample) -> list[Observation]:
    """Conditions a telemetry probe still shows (throttle reasons)."""
    out: list[Observation] = []
    reasons = sample.throttle_reasons
    if reasons & THERMAL_MASK:
        out.append(
            Observation(sample.uuid, KEY_THERMAL, "throttled", Severity.INFO, f"thermal throttling (0x{reasons:x})")
        )
    if reasons & POWER_MASK:
        out.append(
            Observation(sample.uuid, KEY_POWER, "throttled", Severity.INFO, f"power-brake throttling (0x{reasons:x})")
        )
    return out


def lost_observation(uuid: str, message: str) -> Observation:
    """A probe that failed with GPU_IS_LOST."""
    return Observation(uuid, KEY_UNHEALTHY, "fallen-off-bus", Severity.FATAL, f"GPU lost: {message}")


@dataclass(frozen=True)
class GpuDevices:
    """The published devices of one physical GPU: the whole-GPU device name and its MIG devices."""

    uuid: str
    gpu_name: str
    device_names: tuple[str, ...]


@dataclass
class HealthPolicy:
    """Per-GPU condition state. Every mutator returns True when taints or health views changed."""

    settings: HealthSettings
    conditions: dict[str, dict[str, Condition]] = field(default_factory=dict)  # uuid -> key -> condition

    # --- inputs ------------------------------------------------------------------------
    def observe(self, obs: Observation, now: float) -> bool:
        per_gpu = self.conditions.setdefault(obs.uuid, {})
        old = per_gpu.get(obs.key)
        if old is None:
            per_gpu[obs.key] = Condition(obs.key, obs.value, obs.severity, obs.message, now, now)
            return True
        if obs.severity >= old.severity:
            new = replace(
                old, value=obs.value, severity=obs.severity, message=obs.message, last_seen=now, recovered_at=None
            )
        else:  # a weaker sighting refreshes, never downgrades
            new = replace(old, last_seen=now, recovered_at=None)
        per_gpu[obs.key] = new
        return _visible(new) != _visible(old)

    def handle_event(self, event: HealthEvent, now: float) -> bool:
        if event.kind is HealthEventKind.CLEARED:
            return self.recovered(event.uuid, now)
        obs = classify(event, self.settings)
        return False if obs is None else self.observe(obs, now)

    def recovered(self, uuid: str, now: float, keys: Iterable[str] | None = None) -> bool:
        """Recovery evidence for a GPU (all its conditions, or only ``keys``): starts their clocks."""
        per_gpu = self.conditions.get(uuid, {})
        wanted = set(per_gpu) if keys is None else set(keys) & set(per_gpu)
        for key in wanted:
            cond = per_gpu[key]
            if cond.recovered_at is None:
                per_gpu[key] = replace(cond, recovered_at=now)
        return False  # nothing visible changes until the clock runs out

    def probe_ok(self, uuid: str, now: float) -> bool:
        """The GPU answered a probe: evidence that an ``unhealthy`` (lost) condition recovered."""
        return self.recovered(uuid, now, keys=(KEY_UNHEALTHY,))

    def expire(self, now: float) -> bool:
        """Drop conditions gone for ``clear_after_s``. Returns True when any was dropped."""
        changed = False
        for uuid in list(self.conditions):
            per_gpu = self.conditions[uuid]
            for key in list(per_gpu):
                at = per_gpu[key].expires_at(self.settings.clear_after_s)
                if at is not None and now >= at:
                    del per_gpu[key]
                    changed = True
            if not per_gpu:
                del self.conditions[uuid]
        return changed

    def next_expiry(self) -> float | None:
        times = [
            t
            for per_gpu in self.conditions.values()
            for c in per_gpu.values()
            if (t := c.expires_at(self.settings.clear_after_s)) is not None
        ]
        return min(times, default=None)

    # --- outputs -----------------------------------------------------------------------
    def active(self, uuid: str) -> tuple[Condition, ...]:
        return tuple(sorted(self.conditions.get(uuid, {}).values(), key=lambda c: c.key))

    def fatal(self, uuid: str) -> bool:
        return any(c.severity is Severity.FATAL for c in self.conditions.get(uuid, {}).values())

    def taints(self, gpu_names: Mapping[str, str]) -> dict[str, tuple[DeviceTaint, ...]]:
        """GPU device name -> taints, for ``slices.build_pool`` (which copies them to MIG devices).

        ``gpu_names`` maps GPU uuid -> published GPU device name; GPUs not in it are skipped.
        ``timeAdded`` is left to the API server (it defaults it), so the slice content stays
        stable while a condition lasts.
        """
        out: dict[str, tuple[DeviceTaint, ...]] = {}
        for uuid, name in gpu_names.items():
            conds = self.active(uuid)
            if conds:
                out[name] = tuple(c.taint() for c in conds)
        return out

    def views(self, pool: str, gpus: Sequence[GpuDevices], now: float) -> list[DeviceHealthView]:
        """One health view per published device."""
        out: list[DeviceHealthView] = []
        for gpu in gpus:
            conds = self.active(gpu.uuid)
            healthy = not any(c.severity is Severity.FATAL for c in conds)
            message = "; ".join(f"{c.key}={c.value} ({c.severity.effect}): {c.message}" for c in conds)
            updated = max((c.first_seen for c in conds), default=now)
            for device in gpu.device_names:
                out.append(
                    DeviceHealthView(
                        pool_name=pool,
                        device_name=device,
                        healthy=healthy,
                        message=message[:1024],
                        last_updated=int(updated),
                    )
                )
        return out


def _visible(c: Condition) -> tuple[str, str, Severity]:
    return (c.key, c.value, c.severity)


# --- persistence ---------------------------------------------------------------------------
# Conditions survive a driver restart (a fatal Xid must not be forgotten because the plugin pod
# was rolled). After a node reboot every GPU has been reset, which is recovery evidence: the
# loaded conditions start their clearing clocks at load time.

STATE_VERSION = 1


def encode_state(conditions: Mapping[str, Mapping[str, Condition]], boot_id: str) -> bytes:
    doc = {
        "version": STATE_VERSION,
        "bootID": boot_id,
        "conditions": {
            uuid: {
                key: {
                    "value": c.value,
                    "severity": c.severity.name,
                    "message": c.message,
                    "firstSeen": c.first_seen,
                    "lastSeen": c.last_seen,
                    "recoveredAt": c.recovered_at,
                }
                for key, c in sorted(per_gpu.items())
            }
            for uuid, per_gpu in sorted(conditions.items())
        },
    }
    return json.dumps(doc, sort_keys=True).encode()


def decode_state(data: bytes, boot_id: str, now: float) -> dict[str, dict[str, Condition]]:
    """Conditions from a saved state; raises ValueError on a file that is not one."""
    try:
        doc = json.loads(data)
        raw = doc["conditions"]
        rebooted = doc.get("bootID") != boot_id
        out: dict[str, dict[str, Condition]] = {}
        for uuid, per_gpu in raw.items():
            for key, c in per_gpu.items():
                recovered = c.get("recoveredAt")
                if rebooted and recovered is None:
                    recovered = now
                out.setdefault(uuid, {})[key] = Condition(
                    key=key,
                    value=str(c["value"]),
                    severity=Severity[c["severity"]],
                    message=str(c.get("message", "")),
                    first_seen=float(c["firstSeen"]),
                    last_seen=float(c["lastSeen"]),
                    recovered_at=None if recovered is None else float(recovered),
                )
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a health state file: {exc}") from exc
    return out
