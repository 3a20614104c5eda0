"""The command lines and environments of a real node's processes, and where they log.

``driver_argv`` is ``gpuplane-driver --backend=sim`` with its registration and
plugin directories in the node's kubelet root, its CDI specs where the node's
containerd reads them, and the repository's MPS stand-in as the control binary.
``process_env`` puts the node's containerd and its shim first on PATH (containerd
finds ``containerd-shim-runc-v2`` there).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import yaml

from e2e.cluster.realnode import binaries
from e2e.plane.realnode import teardown
from e2e.plane.realnode.plan import RealNode


@dataclasses.dataclass(frozen=True)
class Access:
    """How real nodes reach the control plane."""

    admin_kubeconfig: Path
    server: str
    pki_dir: Path

    @classmethod
    def of(cls, state_dir: Path, kubeconfig: Path) -> Access:
        """Read the server from the admin kubeconfig; the CA is in ``<state>/pki``."""
        data = yaml.safe_load(kubeconfig.read_text())
        return cls(kubeconfig, str(data["clusters"][0]["cluster"]["server"]), state_dir / "pki")

    @property
    def ca_cert(self) -> Path:
        """The cluster CA."""
        return self.pki_dir / "ca.crt"


def log_path(state_dir: Path, process: str) -> Path:
    """The log of one node process."""
    return state_dir / "logs" / f"{process}.log"


def driver_argv(node: RealNode, kubeconfig: Path) -> list[str]:
    """The driver's command line on a real node."""
    script = Path(sys.executable).with_name("gpuplane-driver")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "gpuplane.driver.main"]
    argv = [
        *command,
        f"--node-name={node.name}",
        f"--kubeconfig={kubeconfig}",
        "--backend=sim",
        f"--sim-profile={node.profile}",
        f"--sim-state-dir={node.sim_state_dir}",
        f"--registry-dir={node.registry_dir}",
        f"--plugin-dir={node.plugin_dir}",
        f"--cdi-root={node.cdi_root}",
        f"--mps-control-binary={teardown.MPS_STANDIN}",
        f"--metrics-address=127.0.0.1:{node.metrics_port}",
        "--metrics-auth=none",  # loopback plain HTTP (development); the DaemonSet wants a token
        "--republish-interval=10",
        "--log-format=json",
    ]
    if node.sim_config:
        argv.append(f"--sim-config={node.sim_config_file}")
    return argv


def process_env(bins: binaries.NodeBinaries) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{bins.containerd_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return env
