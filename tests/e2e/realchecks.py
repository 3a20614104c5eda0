"""Checks shared by the real-node tests: what a container must see for the claims it uses.

A container that uses one claim must see exactly that claim's devices: the
GPU (``/dev/nvidia<minor>``, 195:minor) of every allocated device, the MIG
capability nodes of a MIG device, the control and UVM nodes, and nothing else
NVIDIA; its ``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES`` name the GPU or
MIG UUIDs the driver recorded, ``GPUPLANE_CLAIM_UID`` the claim; an MPS claim's
container also gets the daemon's pipe directory and ``/dev/shm``; a claim given an IMEX channel, that channel's
node (``/dev/nvidia-caps-imex-channels/channel<N>``) and ``GPUPLANE_IMEX_CHANNEL``, no other channel.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

from e2e.plane.realnode import inspect
from e2e.plane.realnode.plan import RealNode
from gpuplane.driver.hw import caps, sim_devnodes
from gpuplane.driver.plugin import call_log
from gpuplane.driver.prepare.checkpoint import ClaimRecord
from gpuplane.driver.sharing.mps_spec import CONTAINER_PIPE_DIR, CONTAINER_SHM_DIR

IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"


def runtime_uuids(record: ClaimRecord) -> list[str]:
    """The UUIDs a CUDA process must be given: the MIG device's where there is one, else the GPU's."""
    return [d.mig.mig_uuid if d.mig is not None and d.mig.mig_uuid else d.gpu_uuid for d in record.devices]


def expected_devices(record: ClaimRecord, node: RealNode | None = None) -> dict[str, tuple[int, int]]:
    """``/dev`` path -> (major, minor) of every NVIDIA node the claim's containers need: with an IMEX channel
    (a gang's or an IMEX group's claim across trays), its node, whose major is the one in ``node``'s simulated
    ``/proc/devices`` (as the driver reads the kernel's)."""
    nodes = {
        "/dev/nvidiactl": (sim_devnodes.NVIDIA_MAJOR, sim_devnodes.NVIDIACTL_MINOR),
        "/dev/nvidia-uvm": (sim_devnodes.UVM_MAJOR, 0),
        "/dev/nvidia-uvm-tools": (sim_devnodes.UVM_MAJOR, 1),
    }
    for device in record.devices:
        nodes[f"/dev/nvidia{device.gpu_minor}"] = (sim_devnodes.NVIDIA_MAJOR, device.gpu_minor)
        if device.mig is not None:
            for cap in (device.mig.gi_caps_minor, device.mig.ci_caps_minor):
                assert cap is not None, f"MIG device {device.device} has no capability minor recorded"
                nodes[f"/dev/nvidia-caps/nvidia-cap{cap}"] = (sim_devnodes.CAPS_MAJOR, cap)
    if record.imex_channel is not None:
        assert node is not None, f"claim {record.uid} has IMEX channel {record.imex_channel}: the node is needed"
        major = caps.imex_channel_major((node.sim_state_dir / "proc" / "devices").read_text())
        assert major is not None, f"{node.name}'s /proc/devices has no {caps.IMEX_CHANNELS}"
        nodes[f"{IMEX_CHANNEL_DIR}/channel{record.imex_channel}"] = (major, record.imex_channel)
    return nodes


def assert_sees_claim(view: inspect.ContainerView, record: ClaimRecord, node: RealNode) -> None:
    """The container sees exactly what ``record`` (its only claim) gives it."""
    uuids = runtime_uuids(record)
    assert view.env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") == uuids, view.env
    assert view.env.get("CUDA_VISIBLE_DEVICES", "").split(",") == uuids, view.env
    assert view.env.get("GPUPLANE_CLAIM_UID") == record.uid
    assert dict(view.devices) == expected_devices(record, node)
    channel = view.env.get("GPUPLANE_IMEX_CHANNEL")
    assert channel == (None if record.imex_channel is None else str(record.imex_channel)), (channel, record)
    if record.sharing.strategy == "MPS":
        assert view.env.get("CUDA_MPS_PIPE_DIRECTORY") == CONTAINER_PIPE_DIR
        claim_dir = node.mps_root / record.uid
        assert view.mounts.get(CONTAINER_PIPE_DIR) == str(claim_dir / "pipe"), view.mounts
        assert view.mounts.get(CONTAINER_SHM_DIR) == str(claim_dir / "shm"), view.mounts
    else:
        assert "CUDA_MPS_PIPE_DIRECTORY" not in view.env
        assert CONTAINER_PIPE_DIR not in view.mounts


def claim_containers(pod: dict[str, Any]) -> dict[str, list[str]]:
    """Container name -> the pod-claim names it uses (``resources.claims``)."""
    return {
        c["name"]: [ref["name"] for ref in (c.get("resources") or {}).get("claims") or []]
        for c in pod["spec"]["containers"]
    }


def pod_claim(pod: dict[str, Any], entry: str) -> str:
    """The ResourceClaim name behind the pod's claim entry ``entry``."""
    for claim in pod["spec"].get("resourceClaims") or []:
        if claim["name"] == entry:
            if claim.get("resourceClaimName"):
                return str(claim["resourceClaimName"])
            generated = {
                s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []
            }
            return str(generated[entry])
    raise AssertionError(f"pod {pod['metadata']['name']} has no claim entry {entry!r}")


def container_claims(pod: dict[str, Any]) -> dict[str, list[str]]:
    """Container name -> the ResourceClaim names it uses: its ``resources.claims`` entries and, for an extended
    resource served through DRA (``nvidia.com/gpu``), the scheduler's claim where ``requestMappings`` name it."""
    out = {c: [pod_claim(pod, entry) for entry in entries] for c, entries in claim_containers(pod).items()}
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    for mapping in extended.get("requestMappings") or []:
        names = out.setdefault(mapping["containerName"], [])
        if extended["resourceClaimName"] not in names:
            names.append(str(extended["resourceClaimName"]))
    return out


@dataclasses.dataclass(frozen=True)
class Call:
    """One call the driver received, from its ``kubelet call`` log line."""

    at: float  # seconds since the epoch
    method: str  # the short name, e.g. NodePrepareResources
    service: str  # e.g. k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin
    request: dict[str, Any]

    def claims(self) -> list[tuple[str, str, str]]:
        """(namespace, name, uid) of each claim of a DRA request."""
        return [(c.get("namespace", ""), c.get("name", ""), c.get("uid", "")) for c in self.request.get("claims", [])]


def kubelet_calls(driver_log: Path) -> list[Call]:
    """Every call the driver logged (``gpuplane.driver.plugin.call_log``), in order."""
    calls = []
    for line in driver_log.read_text(errors="replace").splitlines():
        if call_log.CALL_EVENT not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") != call_log.CALL_EVENT:
            continue
        service, _, method = str(entry["method"]).strip("/").partition("/")
        stamp = datetime.datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()
        calls.append(Call(at=stamp, method=method, service=service, request=dict(entry.get("request") or {})))
    return calls


def device_status_problems(claim: dict[str, Any], record: ClaimRecord, driver: str) -> list[str]:
    """How the claim's ``status.devices`` differs from what the driver prepared (empty: it says what was got).

    One entry per prepared device, of this driver and the device's pool, with the UUID CUDA sees, the GPU,
    the MIG profile, the sharing strategy, the MPS pipe dir (MPS claims) and a Ready=True condition.
    """
    got = {
        (d.get("driver"), d.get("pool"), d.get("device")): d for d in (claim.get("status") or {}).get("devices") or []
    }
    problems: list[str] = []
    for d, uuid in zip(record.devices, runtime_uuids(record), strict=True):
        entry = got.get((driver, d.pool, d.device))
        if entry is None:
            problems.append(f"no status.devices entry for {d.pool}/{d.device}")
            continue
        data = entry.get("data") or {}
        want = {"uuid": uuid, "gpuUUID": d.gpu_uuid, "kind": d.kind}
        want |= {"migProfile": d.mig.profile_name} if d.mig is not None else {}
        want |= {"mpsPipeDirectory": CONTAINER_PIPE_DIR} if record.mps_daemon else {}
        problems += [f"{d.device}: data.{k} is {data.get(k)!r}, not {v!r}" for k, v in want.items() if data.get(k) != v]
        if (data.get("sharing") or {}).get("strategy") != record.sharing.strategy:
            problems.append(f"{d.device}: sharing {data.get('sharing')!r}, strategy not {record.sharing.strategy!r}")
        ready = [c for c in entry.get("conditions") or [] if c.get("type") == "Ready"]
        if [c.get("status") for c in ready] != ["True"]:
            problems.append(f"{d.device}: conditions {entry.get('conditions')!r} have no Ready=True")
    return problems
