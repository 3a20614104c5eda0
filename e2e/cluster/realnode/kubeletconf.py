"""A real node's kubelet: its KubeletConfiguration and command line.

The settings a kubelet needs on this kind of machine (``docs/real-nodes.md``
has the reasons): ``failCgroupV1: false`` (kubelet 1.36 refuses cgroup v1
otherwise) with ``cgroupDriver: cgroupfs`` and a ``cgroupRoot`` of its own,
``failSwapOn: false``, eviction thresholds at 1 % disk and 100Mi memory (a shared
development disk is often fuller than the 10-15 % defaults allow),
``imageGCHighThresholdPercent: 100`` (the offline images can never be pulled
again), ``makeIPTablesUtilChains: false`` (no machine-wide iptables chains that
two clusters would fight over), the control plane's feature gates, and every
path under the node's own root (plugin registry, pod logs, volume plugins,
certificates).

kube-apiserver reaches the kubelet at the node's InternalIP (the bridge
address) with its kubelet-client certificate (group ``system:masters``);
kubelet authenticates it against the cluster CA and authorizes it by webhook.
The kubelet itself authenticates as ``system:node:<name>`` (Node authorizer,
NodeRestriction).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


@dataclasses.dataclass(frozen=True)
class KubeletSettings:
    """What differs between real nodes."""

    node_name: str
    node_ip: str
    root_dir: Path
    kubeconfig: Path
    client_ca: Path
    runtime_socket: Path
    cgroup_root: str
    port: int
    healthz_port: int
    feature_gates: Mapping[str, bool]
    labels: Mapping[str, str]
    cgroup_v1: bool = True

    @property
    def pod_logs_dir(self) -> Path:
        """Container logs (kubelet's podLogsDir)."""
        return self.root_dir / "pod-logs"

    @property
    def cert_dir(self) -> Path:
        """kubelet's self-signed serving certificate."""
        return self.root_dir / "pki"


def configuration(settings: KubeletSettings) -> dict[str, Any]:
    """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1)."""
    doc: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": settings.node_ip,
        "port": settings.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": settings.healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(settings.client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{settings.runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": settings.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": False,
        "featureGates": dict(settings.feature_gates),
        "evictionHard": {"nodefs.available": "1%", "imagefs.available": "1%", "memory.available": "100Mi"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(settings.pod_logs_dir),
        "volumePluginDir": str(settings.root_dir / "volume-plugins"),
        "registerNode": True,
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
        "maxPods": 110,
        "shutdownGracePeriod": "0s",
        "nodeStatusUpdateFrequency": "10s",
        "syncFrequency": "10s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "logging": {"format": "text"},
    }
    if settings.cgroup_v1:
        doc["failCgroupV1"] = False
    return doc


def write_configuration(path: Path, settings: KubeletSettings) -> Path:
    """Write the configuration file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(configuration(settings), sort_keys=True))
    return path


def argv(kubelet: Path, config_file: Path, settings: KubeletSettings, verbosity: int = 2) -> list[str]:
    """kubelet's command line (what has no configuration field)."""
    labels = ",".join(f"{k}={v}" for k, v in sorted(settings.labels.items()))
    args = [
        str(kubelet),
        f"--config={config_file}",
        f"--kubeconfig={settings.kubeconfig}",
        f"--root-dir={settings.root_dir}",
        f"--cert-dir={settings.cert_dir}",
        f"--hostname-override={settings.node_name}",
        f"--node-ip={settings.node_ip}",
        f"--v={verbosity}",
    ]
    if labels:
        args.append(f"--node-labels={labels}")
    return args
