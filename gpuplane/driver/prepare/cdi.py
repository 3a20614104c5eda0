"""CDI (Container Device Interface) specs, one file per prepared claim.

The container runtime reads these files; kubelet only passes the CDI ids the
driver returns. Every spec is verified after it is written (read back, parsed,
every device present with its device nodes) before prepare reports success.

A device node has the path the container sees (``/dev/nvidia3``) and, where the
node lives elsewhere on the host (the hardware backend says so), a ``hostPath``:
the runtime then makes the container's node from that one.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuplane.api import names
from gpuplane.driver.host import atomic_write

CDI_VERSION = "0.6.0"  # deviceNodes, env, mounts (with type) and spec annotations (0.6.0)
MIG_OWNERSHIP_ANNOTATION = "gpu.gpuplane.dev/mig-instances"
_NAME_OK = re.compile(r"[^a-zA-Z0-9_.-]")


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rbind", "rw")
    type: str = "bind"


@dataclass(frozen=True)
class DeviceNode:
    """A character device for the container: its path there, and where it is on the host."""

    path: str  # in the container, e.g. /dev/nvidia3
    host_path: str  # on the host; equal to ``path`` where the node is at its standard place

    def render(self) -> dict[str, str]:
        """The spec's ``deviceNodes`` entry (``hostPath`` only where it differs)."""
        return {"path": self.path} if self.host_path == self.path else {"path": self.path, "hostPath": self.host_path}


@dataclass(frozen=True)
class DeviceEdits:
    """What one allocated device adds to a container."""

    device_name: str  # the ResourceSlice device name, e.g. gpu-0
    device_nodes: tuple[DeviceNode, ...]
    env: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True)
class ClaimSpec:
    claim_uid: str
    devices: tuple[DeviceEdits, ...]
    common_env: tuple[str, ...] = ()
    common_device_nodes: tuple[DeviceNode, ...] = ()
    common_mounts: tuple[Mount, ...] = field(default_factory=tuple)
    annotations: tuple[tuple[str, str], ...] = ()


class CdiError(Exception):
    """Writing or verifying a CDI spec failed; prepare must not report success."""


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    return _NAME_OK.sub("-", f"{claim_uid}-{device_name}")


def cdi_id(claim_uid: str, device_name: str) -> str:
    return f"{names.CDI_KIND}={cdi_device_name(claim_uid, device_name)}"


def spec_path(cdi_root: Path, claim_uid: str) -> Path:
    return cdi_root / f"{names.CDI_VENDOR}-{names.CDI_CLASS}_{claim_uid}.json"


def _edits(env: Sequence[str], nodes: Sequence[DeviceNode], mounts: Sequence[Mount]) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    if env:
        edits["env"] = list(env)
    if nodes:
        edits["deviceNodes"] = [n.render() for n in nodes]
    if mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "type": m.type,
                "options": list(m.options),
            }
            for m in mounts
        ]
    return edits


def render(spec: ClaimSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": names.CDI_KIND,
        "devices": [
            {
                "name": cdi_device_name(spec.claim_uid, d.device_name),
                "containerEdits": _edits(d.env, d.device_nodes, d.mounts),
            }
            for d in spec.devices
        ],
    }
    common = _edits(spec.common_env, spec.common_device_nodes, spec.common_mounts)
    if common:
        doc["containerEdits"] = common
    if spec.annotations:
        doc["annotations"] = dict(spec.annotations)
    return doc


def write_spec(cdi_root: Path, spec: ClaimSpec, check_host_nodes: bool = False) -> tuple[Path, dict[str, str]]:
    """Write and verify the claim's spec; return its path and device name -> CDI id."""
    path = spec_path(cdi_root, spec.claim_uid)
    document = render(spec)
    atomic_write(path, json.dumps(document, indent=2, sort_keys=True).encode(), mode=0o644)
    verify_spec(path, spec, check_host_nodes)
    return path, {d.device_name: cdi_id(spec.claim_uid, d.device_name) for d in spec.devices}


def verify_spec(path: Path, spec: ClaimSpec, check_host_nodes: bool) -> None:
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CdiError(f"CDI spec {path} unreadable after write: {exc}") from exc
    if document.get("kind") != names.CDI_KIND or document.get("cdiVersion") != CDI_VERSION:
        raise CdiError(f"CDI spec {path} has wrong kind/version")
    present = {d.get("name"): d for d in document.get("devices", [])}
    for device in spec.devices:
        entry = present.get(cdi_device_name(spec.claim_uid, device.device_name))
        if entry is None:
            raise CdiError(f"CDI spec {path} lacks device {device.device_name}")
        nodes = entry.get("containerEdits", {}).get("deviceNodes", [])
        if not nodes:
            raise CdiError(f"CDI spec {path}: device {device.device_name} has no device nodes")
        if check_host_nodes:
            missing = [n.get("hostPath", n["path"]) for n in nodes if not Path(n.get("hostPath", n["path"])).exists()]
            if missing:
                raise CdiError(f"CDI spec {path}: device nodes missing on the host: {', '.join(missing)}")


def resolve(cdi_root: Path, cdi_device_id: str) -> Path | None:
    """Find the spec file that defines a CDI id (what a container runtime does)."""
    kind, _, name = cdi_device_id.partition("=")
    for candidate in sorted(cdi_root.glob("*.json")):
        try:
            document = json.loads(candidate.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if document.get("kind") == kind and any(d.get("name") == name for d in document.get("devices", [])):
            return candidate
    return None


def remove_spec(cdi_root: Path, claim_uid: str) -> bool:
    path = spec_path(cdi_root, claim_uid)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        return True
    return False


def list_claim_specs(cdi_root: Path) -> dict[str, Path]:
    """Claim uid -> spec path for every spec this driver wrote."""
    prefix = f"{names.CDI_VENDOR}-{names.CDI_CLASS}_"
    out: dict[str, Path] = {}
    for path in cdi_root.glob(f"{prefix}*.json"):
        out[path.name[len(prefix) : -len(".json")]] = path
    return out


def driver_mig_instances(path: Path) -> set[tuple[str, int]]:
    """(parent GPU uuid, GI id) pairs a spec says the driver created for its claim.

    This is the second record of MIG ownership, beside the checkpoint: when the checkpoint is
    lost, it tells the driver's own instances from an administrator's.
    """
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return set()
    value = (document.get("annotations") or {}).get(MIG_OWNERSHIP_ANNOTATION, "")
    out: set[tuple[str, int]] = set()
    for item in str(value).split(","):
        parent, _, gi = item.rpartition("/")
        if parent and gi.isdigit():
            out.add((parent, int(gi)))
    return out
