"""What happened to a pod's claims, read back from the API and the node: for the demo table and the tests.

``PodReport.collect(api, pod, nodes)`` gathers, for one pod, its node, each of
its ResourceClaims' allocation (device, pool, shareID, consumed capacity), the
published attributes of each allocated device (from the ResourceSlices), and
what the node's driver recorded in its checkpoint (sharing: MPS limits or
time-slicing; CDI ids). ``render_table(reports)`` lays them out in columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from kubernetes import client

from gpuplane.api import names
from gpuplane.driver.prepare import checkpoint

GROUP, VERSION = "resource.k8s.io", "v1"
_D = names.DRIVER_NAME


def attr_value(attribute: Mapping[str, Any]) -> Any:
    """The value of a published attribute (``{"string": "x"}`` -> ``"x"``)."""
    return next(iter(attribute.values())) if attribute else None


def device_attributes(custom: client.CustomObjectsApi) -> dict[tuple[str, str], dict[str, Any]]:
    """(pool, device) -> attributes (short names for the driver's own domain) of every published device."""
    listed = cast(dict[str, Any], custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices"))
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for item in listed.get("items", []):
        spec = item["spec"]
        if spec.get("driver") != _D:
            continue
        for device in spec.get("devices") or []:
            attrs = {
                key.removeprefix(f"{_D}/"): attr_value(value) for key, value in (device.get("attributes") or {}).items()
            }
            out[(spec["pool"]["name"], device["name"])] = attrs
    return out


class NodeFiles(Protocol):
    """A node whose driver's checkpoint can be read (a simulated node, or a real one)."""

    @property
    def checkpoint(self) -> Path: ...


def read_checkpoint(node: NodeFiles) -> checkpoint.Checkpoint | None:
    """The driver's checkpoint on ``node`` (None if not written yet)."""
    try:
        return checkpoint.decode(node.checkpoint.read_bytes())
    except FileNotFoundError:
        return None


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """Names of the ResourceClaims a pod uses (direct, generated from templates, or the scheduler's
    claim for extended resources such as ``nvidia.com/gpu`` served through DRA)."""
    status = pod.get("status") or {}
    generated = {s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    out = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(entry["name"])
        if name:
            out.append(str(name))
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        out.append(str(extended))
    return out


@dataclasses.dataclass(frozen=True)
class DeviceLine:
    """One allocated device of one claim."""

    claim: str
    request: str
    pool: str
    device: str
    description: str
    sharing: str
    cdi_ids: tuple[str, ...]
    share_id: str | None


@dataclasses.dataclass(frozen=True)
class PodReport:
    """One pod: where it runs and what it got."""

    namespace: str
    name: str
    node: str
    phase: str
    reason: str
    devices: tuple[DeviceLine, ...]

    @classmethod
    def collect(
        cls,
        api: client.ApiClient,
        pod: Mapping[str, Any],
        nodes_by_name: Mapping[str, NodeFiles],
        attributes: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> PodReport:
        """Gather the report for ``pod`` (a plain dict)."""
        custom = client.CustomObjectsApi(api)
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        namespace = str(meta["namespace"])
        node_name = str(spec.get("nodeName") or "")
        node = nodes_by_name.get(node_name)
        recorded = read_checkpoint(node) if node is not None else None
        reason = ""
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") != "True":
                reason = str(condition.get("message") or condition.get("reason") or "")
        lines: list[DeviceLine] = []
        for claim_name in pod_claim_names(pod):
            try:
                obj = cast(
                    dict[str, Any],
                    custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", claim_name),
                )
            except client.ApiException:
                continue
            allocation = (obj.get("status") or {}).get("allocation") or {}
            record = recorded.claims.get(obj["metadata"]["uid"]) if recorded is not None else None
            for result in (allocation.get("devices") or {}).get("results") or []:
                if result.get("driver") != _D:
                    continue
                pool, device = str(result["pool"]), str(result["device"])
                attrs = attributes.get((pool, device), {})
                cdi_ids: tuple[str, ...] = ()
                if record is not None:
                    for dev in record.devices:
                        if dev.device == device and result["request"] in dev.request_names:
                            cdi_ids = tuple(dev.cdi_ids)
                lines.append(
                    DeviceLine(
                        claim=claim_name,
                        request=str(result["request"]),
                        pool=pool,
                        device=device,
                        description=describe_device(device, attrs),
                        sharing=describe_sharing(record, result, allocation),
                        cdi_ids=cdi_ids,
                        share_id=result.get("shareID"),
                    )
                )
        return cls(
            namespace=namespace,
            name=str(meta["name"]),
            node=node_name,
            phase=str(status.get("phase") or ""),
            reason=reason,
            devices=tuple(lines),
        )


def describe_device(device: str, attrs: Mapping[str, Any]) -> str:
    """``gpu-3 H100 80GB HBM3`` or ``MIG 3g.40gb@4 of gpu-2``."""
    if attrs.get("type") == names.DEVICE_TYPE_MIG:
        return f"MIG {attrs.get('migProfile')}@{attrs.get('migPlacement')} of gpu-{attrs.get('parentMinor')}"
    product = str(attrs.get("productName") or "").removeprefix("NVIDIA ")
    return f"{device} {product}".strip()


def _gib(value: int) -> str:
    return f"{value / 2**30:.0f}Gi"


def describe_sharing(
    record: checkpoint.ClaimRecord | None, result: Mapping[str, Any], allocation: Mapping[str, Any]
) -> str:
    """How the device is shared, from the driver's checkpoint (or, before prepare, the allocation's config)."""
    share = (result.get("consumedCapacity") or {}).get(names.CAP_SHARE_PERCENT)
    suffix = f" share {share}%" if share and share != "100" else ""
    if record is not None:
        sharing = record.sharing
        if sharing.strategy == "MPS":
            limits = sorted(set(sharing.mps_pinned_limits.values()))
            pinned = f" pinned {','.join(_gib(v) for v in limits)}" if limits else ""
            return f"MPS threads {sharing.mps_active_thread_percentage}%{pinned}{suffix}"
        if sharing.strategy == "TimeSlicing":
            return f"time-slicing {sharing.timeslice_interval or 'Default'}{suffix}"
        return f"exclusive{suffix}"
    for entry in (allocation.get("devices") or {}).get("config") or []:
        parameters = (entry.get("opaque") or {}).get("parameters") or {}
        strategy = (parameters.get("sharing") or {}).get("strategy")
        if strategy:
            return f"{strategy} (not prepared yet){suffix}"
    return f"(not prepared yet){suffix}"


def render_table(reports: Sequence[PodReport], real_nodes: Collection[str] = ()) -> list[str]:
    """Fixed-width lines: POD, NODE, DEVICES, SHARING, CDI IDS (one line per device).

    A pod on one of ``real_nodes`` (real kubelet and containerd: it ran in real containers) is marked ``*``.
    """
    header = ("POD", "NODE", "DEVICE", "SHARING", "CDI IDS")
    rows: list[tuple[str, str, str, str, str]] = []
    for report in sorted(reports, key=lambda r: (r.namespace, r.name)):
        pod = f"{report.namespace}/{report.name}" + (" *" if report.node in real_nodes else "")
        if report.phase != "Running":
            rows.append((pod, report.node or "-", report.phase or "?", "", report.reason.split(". ")[0]))
            continue
        if not report.devices:
            rows.append((pod, report.node, "(no devices)", "", ""))
        for i, line in enumerate(report.devices):
            cdi = ",".join(cid.split("=", 1)[-1] for cid in line.cdi_ids) or "-"
            rows.append((pod if i == 0 else "", report.node if i == 0 else "", line.description, line.sharing, cdi))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    out = []
    for row in [header, *rows]:
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4])
    return out


def cdi_kind_prefix() -> str:
    """The part every CDI id of ours starts with (the table drops it)."""
    return f"{names.CDI_KIND}="
