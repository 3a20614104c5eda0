"""Hand-written GpuGangs on GB200 trays and what IMEX leaves on a tray, shared by the IMEX and chaos e2e tests.

:func:`gang_items` is a ``GpuGang`` of ``members`` x ``gpus`` GB200 GPUs and its member pause pods (label
and scheduling gate ``gpuplane.dev/gang``; member ``i`` uses the claim ``<gang>-<i>``, which the controller
makes); :func:`gang_objects` is the same as the JSON text of a ``List`` for ``kubectl apply -f -``.
:func:`daemon_pids` finds the live IMEX daemons of a tray (their config under the node's plugin dir) in
``/proc``; :func:`cdi_channels` reads the IMEX channel device nodes and ``GPUPLANE_IMEX_*`` environment of a
claim's CDI spec.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

GB200 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"'
CHANNELS = "/dev/nvidia-caps-imex-channels/channel"
GANG_LABEL = "gpuplane.dev/gang"


def pod_body(ns: str, name: str, claim: str) -> dict[str, Any]:
    """A pause pod using the ResourceClaim ``claim`` as its claim ``g``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "g", "resourceClaimName": claim}],
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "g"}]}}
            ],
        },
    }


def gang_items(ns: str, name: str, members: int, gpus: int) -> list[dict[str, Any]]:
    """The GpuGang ``name`` (``members`` x ``gpus`` GB200 GPUs) and its gated member pods."""
    gang = {
        "apiVersion": "gpuplane.dev/v1alpha1",
        "kind": "GpuGang",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"members": members, "gpusPerMember": gpus, "selectors": [GB200]},
    }
    items: list[dict[str, Any]] = [gang]
    for i in range(members):
        pod = pod_body(ns, f"{name}-pod-{i}", f"{name}-{i}")
        pod["metadata"]["labels"] = {GANG_LABEL: name}
        pod["spec"]["schedulingGates"] = [{"name": GANG_LABEL}]
        items.append(pod)
    return items


def gang_objects(ns: str, name: str, members: int, gpus: int) -> str:
    """:func:`gang_items` as a ``List`` (JSON text) for ``kubectl apply -f -``."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": gang_items(ns, name, members, gpus)})


def daemon_config(plugin_dir: Path) -> Path:
    """The IMEX daemon's config file of a node (``<plugin dir>/imex/config.cfg``)."""
    return plugin_dir / "imex" / "config.cfg"


def daemon_pids(plugin_dir: Path, proc: Path = Path("/proc")) -> list[int]:
    """Live processes running the node's IMEX daemon (their command line names its config)."""
    config = str(daemon_config(plugin_dir)).encode()
    out = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if config in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
    return sorted(out)


def cdi_channels(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The IMEX channel device nodes and ``GPUPLANE_IMEX_*`` environment of a CDI spec (as JSON)."""
    edits = spec.get("containerEdits") or {}
    paths = [n["path"] for n in edits.get("deviceNodes") or [] if str(n.get("path", "")).startswith(CHANNELS)]
    env = [e for e in edits.get("env") or [] if str(e).startswith("GPUPLANE_IMEX_")]
    return paths, env


def channel_paths(channels: Iterable[int]) -> list[str]:
    """The device node paths of IMEX channels."""
    return [f"{CHANNELS}{c}" for c in channels]
