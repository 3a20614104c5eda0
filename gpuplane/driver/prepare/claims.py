"""Read a ResourceClaim's allocation: this driver's results and the opaque configs that apply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import boundedjson, names, quantity
from gpuplane.api.configs import SourcedConfig


class ClaimError(Exception):
    """The claim cannot be prepared as it stands; the message tells the user why."""


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None
    admin_access: bool
    consumed_capacity: Mapping[str, str]


@dataclass(frozen=True)
class ClaimAllocation:
    uid: str
    namespace: str
    name: str
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[SourcedConfig, ...]


def parse_allocation(obj: Mapping[str, Any], expected_uid: str, driver_name: str, pool: str) -> ClaimAllocation:
    meta = obj.get("metadata", {})
    ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    too_deep = boundedjson.rejection(obj)
    if too_deep is not None:
        raise ClaimError(f"ResourceClaim {ns}/{name}: {too_deep}")
    if uid != expected_uid:
        raise ClaimError(
            f"ResourceClaim {ns}/{name} has UID {uid}, kubelet asked for {expected_uid}: "
            "the claim was deleted and recreated; the pod must be recreated too"
        )
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(
            f"ResourceClaim {ns}/{name} is not allocated; nothing to prepare until the scheduler allocates it"
        )
    devices_status = allocation.get("devices") or {}
    devices: list[AllocatedDevice] = []
    for result in devices_status.get("results") or []:
        if result.get("driver") != driver_name:
            continue
        if result.get("pool") != pool:
            raise ClaimError(
                f"ResourceClaim {ns}/{name}: device {result.get('device')} comes from pool {result.get('pool')}, "
                f"but this driver serves pool {pool}"
            )
        devices.append(
            AllocatedDevice(
                request=str(result.get("request", "")),
                pool=str(result["pool"]),
                device=str(result.get("device", "")),
                share_id=result.get("shareID"),
                admin_access=bool(result.get("adminAccess")),
                consumed_capacity=dict(result.get("consumedCapacity") or {}),
            )
        )
    _check_requested_shares(obj, {d.request for d in devices}, f"ResourceClaim {ns}/{name}")
    configs: list[SourcedConfig] = []
    for entry in devices_status.get("config") or []:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver_name:
            continue
        configs.append(
            SourcedConfig(
                source="FromClass" if entry.get("source") == "FromClass" else "FromClaim",
                requests=tuple(entry.get("requests") or ()),
                parameters=opaque.get("parameters") or {},
            )
        )
    return ClaimAllocation(uid=uid, namespace=ns, name=name, devices=tuple(devices), configs=tuple(configs))


def _check_requested_shares(obj: Mapping[str, Any], requests: set[str], where: str) -> None:
    """Refuse a claim whose request asks for a sharePercent outside 1..100 (the scheduler rounds "0" up to 1)."""
    for req in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = str(req.get("name", ""))
        bodies = [(name, req.get("exactly"))] + [
            (f"{name}/{sub.get('name', '')}", sub) for sub in req.get("firstAvailable") or [] if isinstance(sub, dict)
        ]
        for full, body in bodies:
            if not isinstance(body, Mapping) or full not in requests:
                continue
            share = ((body.get("capacity") or {}).get("requests") or {}).get(names.CAP_SHARE_PERCENT)
            if share is None:
                continue
            try:
                quantity.share_percent(share)
            except ValueError as exc:
                raise ClaimError(f"{where}: request {full!r}: capacity.requests.{exc}") from exc
