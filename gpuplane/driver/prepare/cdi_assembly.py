"""A prepared claim's CDI spec, assembled from its checkpoint record: device nodes, environment, mounts.

Each device gets its ``/dev/nvidia<minor>`` node (and, for a MIG device, the ``nvidia-caps`` nodes
of its GPU and compute instance) and an env var naming its UUID. A node is ``/dev/...`` in the
container and ``host_dev/...`` on the host: the backend's own directory of nodes (the simulator's
placeholders) or the dev root. The claim gets ``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES``
with the runtime UUIDs (MIG UUIDs for MIG devices), the control nodes, its MPS daemon's env (with
the claim's ``CUDA_MPS_CLIENT_PRIORITY``) and bind mounts, its gang's IMEX channel node and environment
when its record has one (:mod:`.imex_claims`), and the annotation naming the MIG
instances the driver made for it (so a claim rebuilt after a corrupt checkpoint owns them again).
Pure, given the caps minors (``caps_of``) and the daemon; the file is written by
:func:`gpuplane.driver.prepare.cdi.write_spec`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuplane.driver.prepare import cdi, imex_channel
from gpuplane.driver.prepare.checkpoint import ClaimRecord, DeviceRecord
from gpuplane.driver.sharing.mps_spec import MpsDaemon

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def runtime_uuid(d: DeviceRecord) -> str:
    """The UUID CUDA sees for the device: the MIG device's once it exists, else the GPU's."""
    if d.mig is not None and d.mig.mig_uuid:
        return d.mig.mig_uuid
    return d.gpu_uuid


def claim_spec(
    rec: ClaimRecord,
    host_dev: Path,
    caps_of: Callable[[DeviceRecord], tuple[int | None, int | None]],
    daemon: MpsDaemon | None,
) -> cdi.ClaimSpec:
    """The spec for ``rec``; ``caps_of`` answers for MIG devices whose caps minors the record lacks."""

    def node(name: str) -> cdi.DeviceNode:
        return cdi.DeviceNode(path=f"/dev/{name}", host_path=str(host_dev / name))

    edits: list[cdi.DeviceEdits] = []
    for d in rec.devices:
        nodes = [node(f"nvidia{d.gpu_minor}")]
        env = [f"GPUPLANE_DEVICE_{d.device.upper().replace('-', '_')}_UUID={runtime_uuid(d)}"]
        if d.mig is not None and d.mig.gi_id is not None:
            known = d.mig.gi_caps_minor is not None or d.mig.ci_caps_minor is not None
            gi_cap, ci_cap = (d.mig.gi_caps_minor, d.mig.ci_caps_minor) if known else caps_of(d)
            nodes.extend(node(f"nvidia-caps/nvidia-cap{m}") for m in (gi_cap, ci_cap) if m is not None)
        edits.append(cdi.DeviceEdits(device_name=d.device, device_nodes=tuple(nodes), env=tuple(env)))
    uuids = ",".join(runtime_uuid(d) for d in rec.devices)
    common_env = [
        f"NVIDIA_VISIBLE_DEVICES={uuids}",
        f"CUDA_VISIBLE_DEVICES={uuids}",
        f"GPUPLANE_CLAIM_UID={rec.uid}",
    ]
    common_mounts: list[cdi.Mount] = []
    if daemon is not None:
        daemon_env = daemon.container_env(rec.sharing.mps_client_priority)
        common_env.extend(f"{k}={v}" for k, v in sorted(daemon_env.items()))
        common_mounts.extend(
            cdi.Mount(host_path=str(m.host_path), container_path=str(m.container_path), options=tuple(m.options))
            for m in daemon.container_mounts()
        )
    imex_nodes: tuple[cdi.DeviceNode, ...] = ()
    if rec.imex_channel is not None:  # the gang's channel alone (given by the controller's plan, imex_claims)
        imex_nodes, imex_env = imex_channel.edits(
            imex_channel.Channel(rec.imex_channel, rec.imex_domain or ""), host_dev
        )
        common_env.extend(imex_env)
    made = [
        f"{d.mig.parent_uuid}/{d.mig.gi_id}"
        for d in rec.devices
        if d.mig is not None and d.mig.gi_id is not None and d.mig.created_by_driver
    ]
    return cdi.ClaimSpec(
        annotations=((cdi.MIG_OWNERSHIP_ANNOTATION, ",".join(made)),) if made else (),
        claim_uid=rec.uid,
        devices=tuple(edits),
        common_env=tuple(common_env),
        common_device_nodes=(*(node(n) for n in CONTROL_NODES), *imex_nodes),
        common_mounts=tuple(common_mounts),
    )
