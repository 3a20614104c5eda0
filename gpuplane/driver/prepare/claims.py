"""Read a ResourceClaim's allocation: this driver's results and the opaque configs that apply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.driver.api.configs import SourcedConfig


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
