"""Opaque device configuration (``gpu.gpuplane.dev/v1alpha1``) as strict pydantic models.

Users put these objects in ``DeviceClass.spec.config[].opaque.parameters`` or in
``ResourceClaim.spec.devices.config[].opaque.parameters``. The driver validates
them at prepare time and the controller validates them as soon as a claim
appears, with the same models, so a bad config is reported before a pod ever
reaches a node.

Merge rule: class configs first, then claim configs; later wins field by field.
For MPS quotas a class sets a ceiling (a tier): a claim may tighten it but never
loosen it, which :func:`merge_configs` enforces. A time-slicing class's interval is a tier too (a
claim may lengthen it, never shorten it), and its consent to lower tiers
(``shareWithLowerTiers``) is never a claim's (:func:`parse_claim_config`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from gpuplane.api import names, quantity

SharingStrategy = Literal["Exclusive", "TimeSlicing", "MPS"]
TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]
ClientPriority = Literal["Normal", "BelowNormal"]
# CUDA_MPS_CLIENT_PRIORITY / set_default_client_priority values (NVIDIA MPS guide, "Tools and Interface
# Reference": "Allowed values are 0 [NORMAL] and 1 [BELOW NORMAL]"; a hint to the CUDA driver).
CLIENT_PRIORITY_VALUES: dict[str, int] = {"Normal": 0, "BelowNormal": 1}
# A device name as a ResourceSlice publishes it (a DNS label, e.g. gpu-0 or gpu-0-mig-1g-10gb-0).
DeviceName = Annotated[str, StringConstraints(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
QuantityText = Annotated[str, StringConstraints(max_length=quantity.MAX_CHARS)]
MAX_PER_DEVICE_LIMITS = 128  # more device names than any node publishes
MAX_MESSAGE = 2000  # characters of one ConfigError: every field of a hostile config may be wrong


class _Strict(BaseModel):
    # strict: no coercion (true is not 1, "50" is not 50); every string and map bounded.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False, strict=True)


class TimeSlicingConfig(_Strict):
    """The GPU's time-slice (one per GPU: see gpuplane/driver/sharing/timeslice_tiers.py).

    ``shareWithLowerTiers`` (a class's choice, never a claim's) lets claims of lower tiers, i.e.
    longer intervals, share a GPU with this class's claims; the GPU then keeps this interval.
    """

    interval: TimeSliceInterval = "Default"
    shareWithLowerTiers: bool = False


class MpsConfig(_Strict):
    """Per-claim MPS daemon limits.

    ``defaultActiveThreadPercentage`` caps the share of SMs each client may use;
    ``defaultPinnedDeviceMemoryLimit`` caps pinned device memory per device;
    ``perDevicePinnedMemoryLimit`` overrides it per allocated device (keyed by
    the device name in the ResourceSlice, e.g. ``gpu-0``); ``clientPriority`` is the
    scheduling priority of the claim's MPS clients (``Normal`` or ``BelowNormal``).
    """

    defaultActiveThreadPercentage: Annotated[int, Field(ge=1, le=100)] | None = None
    defaultPinnedDeviceMemoryLimit: QuantityText | None = None
    perDevicePinnedMemoryLimit: Annotated[dict[DeviceName, QuantityText], Field(max_length=MAX_PER_DEVICE_LIMITS)] = (
        Field(default_factory=dict)
    )
    clientPriority: ClientPriority | None = None

    @field_validator("defaultActiveThreadPercentage", mode="before")
    @classmethod
    def _check_percentage(cls, value: Any) -> Any:
        # Before the ge/le constraints, which would name only the bound that was crossed.
        if isinstance(value, int | float) and not isinstance(value, bool) and not 1 <= value <= 100:
            raise ValueError("must be in 1..100 (percent of the device's SMs)")
        return value

    @field_validator("defaultPinnedDeviceMemoryLimit")
    @classmethod
    def _check_default_limit(cls, value: str | None) -> str | None:
        if value is not None and quantity.parse_quantity(value) <= 0:
            raise ValueError("must be greater than zero")
        return value

    @field_validator("perDevicePinnedMemoryLimit")
    @classmethod
    def _check_per_device(cls, value: dict[str, str]) -> dict[str, str]:
        for device, limit in value.items():
            try:
                if quantity.parse_quantity(limit) <= 0:
                    raise ValueError("must be greater than zero")
            except ValueError as exc:
                raise ValueError(f"limit for device {device!r}: {exc}") from exc
        return value

    def default_limit_bytes(self) -> int | None:
        if self.defaultPinnedDeviceMemoryLimit is None:
            return None
        return quantity.parse_quantity(self.defaultPinnedDeviceMemoryLimit)

    def client_priority_value(self) -> int | None:
        """The CUDA_MPS_CLIENT_PRIORITY value (0 normal, 1 below normal), or None when unset."""
        return None if self.clientPriority is None else CLIENT_PRIORITY_VALUES[self.clientPriority]

    def limit_bytes_for(self, device_name: str) -> int | None:
        if device_name in self.perDevicePinnedMemoryLimit:
            return quantity.parse_quantity(self.perDevicePinnedMemoryLimit[device_name])
        return self.default_limit_bytes()


class Sharing(_Strict):
    strategy: SharingStrategy = "Exclusive"
    timeSlicing: TimeSlicingConfig | None = None
    mps: MpsConfig | None = None

    @pydantic.model_validator(mode="after")
    def _strategy_matches(self) -> Sharing:
        if self.timeSlicing is not None and self.strategy != "TimeSlicing":
            raise ValueError("timeSlicing is set but strategy is not 'TimeSlicing'")
        if self.mps is not None and self.strategy != "MPS":
            raise ValueError("mps is set but strategy is not 'MPS'")
        return self


class GpuConfig(_Strict):
    """Configuration for whole-GPU devices (``type == "gpu"``)."""

    apiVersion: Literal["gpu.gpuplane.dev/v1alpha1"]
    kind: Literal["GpuConfig"]
    sharing: Sharing = Field(default_factory=Sharing)


class MigDeviceConfig(_Strict):
    """Configuration for MIG devices (``type == "mig"``). Time-slicing does not apply to MIG."""

    apiVersion: Literal["gpu.gpuplane.dev/v1alpha1"]
    kind: Literal["MigDeviceConfig"]
    sharing: Sharing = Field(default_factory=Sharing)

    @field_validator("sharing")
    @classmethod
    def _no_timeslicing(cls, value: Sharing) -> Sharing:
        if value.strategy == "TimeSlicing":
            raise ValueError("strategy 'TimeSlicing' is not supported on MIG devices; use 'Exclusive' or 'MPS'")
        return value


DeviceConfig = GpuConfig | MigDeviceConfig
_KINDS: dict[str, type[GpuConfig] | type[MigDeviceConfig]] = {
    "GpuConfig": GpuConfig,
    "MigDeviceConfig": MigDeviceConfig,
}


class ConfigError(ValueError):
    """A user's opaque config is invalid. The message names the field and the allowed values."""


def _describe(error: Any) -> str:
    loc = ".".join(quantity.shown(p) if not isinstance(p, str) else p[:64] for p in error.get("loc", ()))
    loc = loc.replace(".function-after", "")
    msg = str(error.get("msg", "invalid"))[:300]
    if error.get("type") == "extra_forbidden":
        msg = "unknown field"
    got = error.get("input")
    text = f"{loc}: {msg}" if loc else msg
    if error.get("type") not in ("extra_forbidden", "missing") and not isinstance(got, dict):
        text += f" (got {quantity.shown(got)})"
    return text


def _bounded(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "… (more errors left out)"


def parse_config(parameters: Any, source: str = "config") -> DeviceConfig:
    """Validate one opaque ``parameters`` object; raise ConfigError naming what is wrong."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{source}: parameters must be an object with apiVersion and kind")
    api_version = parameters.get("apiVersion")
    if api_version != names.CONFIG_API_VERSION:
        got = quantity.shown(api_version)
        raise ConfigError(f"{source}: apiVersion must be {names.CONFIG_API_VERSION!r} (got {got})")
    kind = parameters.get("kind")
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        allowed = ", ".join(repr(k) for k in _KINDS)
        raise ConfigError(f"{source}: kind must be one of {allowed} (got {quantity.shown(kind)})")
    try:
        return model.model_validate(dict(parameters))
    except pydantic.ValidationError as exc:
        details = "; ".join(_describe(err) for err in exc.errors())
        raise ConfigError(_bounded(f"{source} ({kind}): {details}")) from exc


def parse_claim_config(parameters: Any, source: str = "claim config") -> DeviceConfig:
    """:func:`parse_config` for a claim's own config: also refuses what only a DeviceClass may set.

    ``timeSlicing.shareWithLowerTiers: true`` is a class's consent to lower tiers on its GPUs; a claim
    that could set it would consent for itself (and, on a class without a time-slicing tier such as
    ``gpu.gpuplane.dev``, pick ``Short``, i.e. gold, as well), so a claim that sets it is refused
    whatever its class says. ``false`` (the default) asks nothing and is accepted. Context-free, like
    the admission policy ``gpuplane-claim-configs`` that refuses the same at creation.
    """
    parsed = parse_config(parameters, source)
    ts = parsed.sharing.timeSlicing
    if ts is not None and ts.shareWithLowerTiers:
        raise ConfigError(
            f"{source}: timeSlicing.shareWithLowerTiers is the device class's choice, never a claim's; remove it "
            "from the claim's config (to let lower tiers share a GPU with this claim, use a DeviceClass that "
            "sets it, e.g. a copy of timeslice-gold.gpu.gpuplane.dev with shareWithLowerTiers: true)"
        )
    return parsed


@dataclass(frozen=True)
class SourcedConfig:
    """One opaque config entry as the allocation reports it."""

    source: Literal["FromClass", "FromClaim"]
    requests: tuple[str, ...]  # empty: applies to every request
    parameters: Mapping[str, Any]

    def applies_to(self, request: str) -> bool:
        # "req/sub" results (firstAvailable) match configs naming the parent request.
        parent = request.split("/", 1)[0]
        return not self.requests or request in self.requests or parent in self.requests


def _tightened(merged: MpsConfig | None, claim: MpsConfig, ceiling: MpsConfig | None, where: str) -> MpsConfig:
    """Overlay claim MPS settings on the class ones, refusing anything looser than the class."""
    base = merged or MpsConfig()
    if ceiling is not None:
        pct, cap = claim.defaultActiveThreadPercentage, ceiling.defaultActiveThreadPercentage
        if pct is not None and cap is not None and pct > cap:
            raise ConfigError(
                f"{where}: mps.defaultActiveThreadPercentage {pct} exceeds the device class limit {cap}; "
                f"a claim may only tighten its class's quota (use a value in 1..{cap} or another class)"
            )
        cap_bytes = ceiling.default_limit_bytes()
        for label, value in [("defaultPinnedDeviceMemoryLimit", claim.defaultPinnedDeviceMemoryLimit)] + [
            (f"perDevicePinnedMemoryLimit[{k}]", v) for k, v in claim.perDevicePinnedMemoryLimit.items()
        ]:
            if value is not None and cap_bytes is not None and quantity.parse_quantity(value) > cap_bytes:
                raise ConfigError(
                    f"{where}: mps.{label} {value} exceeds the device class limit "
                    f"{ceiling.defaultPinnedDeviceMemoryLimit}; a claim may only tighten its class's quota"
                )
        want, tier = claim.client_priority_value(), ceiling.client_priority_value()
        if want is not None and tier is not None and want < tier:
            raise ConfigError(
                f"{where}: mps.clientPriority {claim.clientPriority} is above the device class's "
                f"{ceiling.clientPriority}; a claim may lower its priority, never raise it above its tier"
            )
    return MpsConfig(
        defaultActiveThreadPercentage=(
            claim.defaultActiveThreadPercentage
            if claim.defaultActiveThreadPercentage is not None
            else base.defaultActiveThreadPercentage
        ),
        defaultPinnedDeviceMemoryLimit=(
            claim.defaultPinnedDeviceMemoryLimit
            if claim.defaultPinnedDeviceMemoryLimit is not None
            else base.defaultPinnedDeviceMemoryLimit
        ),
        perDevicePinnedMemoryLimit={**base.perDevicePinnedMemoryLimit, **claim.perDevicePinnedMemoryLimit},
        clientPriority=claim.clientPriority if claim.clientPriority is not None else base.clientPriority,
    )


_TS_RANK = {"Short": 3, "Medium": 2, "Long": 1, "Default": 0}  # as gpuplane.driver.sharing.timeslice_tiers


def _timeslice_within(ceiling: TimeSlicingConfig, sharing: Sharing, where: str) -> Sharing:
    """A claim's time-slicing under a tier class: a longer interval is fine, a shorter one is not.

    Consent (shareWithLowerTiers) stays the class's: :func:`parse_claim_config` refused a claim's own.
    """
    claim = sharing.timeSlicing or TimeSlicingConfig(interval=ceiling.interval)
    if _TS_RANK[claim.interval] > _TS_RANK[ceiling.interval]:
        raise ConfigError(
            f"{where}: timeSlicing.interval {claim.interval} is a higher tier than the device class's "
            f"{ceiling.interval}; a claim may lengthen its interval, never shorten it"
        )
    return Sharing(
        strategy="TimeSlicing",
        timeSlicing=TimeSlicingConfig(interval=claim.interval, shareWithLowerTiers=ceiling.shareWithLowerTiers),
    )


def merge_configs(entries: Sequence[SourcedConfig], request: str, device_type: str) -> DeviceConfig:
    """The effective config for one request: class configs, then claim configs, later wins.

    Entries whose kind does not match the device type are an error (a MigDeviceConfig on a
    whole GPU is a user mistake, not something to ignore silently).
    """
    want: type[GpuConfig] | type[MigDeviceConfig] = (
        MigDeviceConfig if device_type == names.DEVICE_TYPE_MIG else GpuConfig
    )
    merged: DeviceConfig = want.model_validate({"apiVersion": names.CONFIG_API_VERSION, "kind": want.__name__})
    class_mps: MpsConfig | None = None
    class_ts: TimeSlicingConfig | None = None
    ordered = [e for e in entries if e.source == "FromClass"] + [e for e in entries if e.source == "FromClaim"]
    for entry in ordered:
        if not entry.applies_to(request):
            continue
        where = f"{'class' if entry.source == 'FromClass' else 'claim'} config for request {request!r}"
        parsed = (parse_config if entry.source == "FromClass" else parse_claim_config)(entry.parameters, where)
        if not isinstance(parsed, want):
            raise ConfigError(
                f"{where}: kind {parsed.kind!r} does not apply to a {device_type!r} device; use {want.__name__!r}"
            )
        sharing = parsed.sharing
        if sharing.strategy == "TimeSlicing" and entry.source == "FromClaim" and class_ts is not None:
            sharing = _timeslice_within(class_ts, sharing, where)
        if sharing.strategy == "TimeSlicing" and entry.source == "FromClass":
            class_ts = sharing.timeSlicing or TimeSlicingConfig()
        if sharing.strategy == "MPS":
            mps = sharing.mps or MpsConfig()
            if entry.source == "FromClass":
                class_mps = _tightened(class_mps, mps, None, where)
                new_mps = class_mps
            else:
                prior = merged.sharing.mps if merged.sharing.strategy == "MPS" else None
                new_mps = _tightened(prior, mps, class_mps, where)
            sharing = Sharing(strategy="MPS", mps=new_mps)
        elif class_mps is not None and entry.source == "FromClaim":
            raise ConfigError(
                f"{where}: strategy {sharing.strategy!r} would drop the device class's MPS quota; "
                f"a claim may only tighten its class's quota"
            )
        merged = want.model_validate(
            {"apiVersion": names.CONFIG_API_VERSION, "kind": want.__name__, "sharing": sharing}
        )
    return merged
