"""A node served by the NVIDIA device plugin, as the scheduler sees it: ``nvidia.com/gpu`` in its capacity.

The mixed-fleet tests need a node that has not moved to gpuplane yet. On such
a node the device plugin registers ``nvidia.com/gpu`` with kubelet, and kubelet
reports it in the Node's ``status.capacity`` and ``allocatable``; the scheduler
then counts ``nvidia.com/gpu`` requests against that number (NodeResourcesFit)
and never sends the pod's request to DRA there (``shouldDelegateResourceToDRA``:
a node whose allocatable has the resource keeps it). ``LegacyNode`` is exactly
that: a kubelet stand-in (``e2e.plane.kubelet --capacity nvidia.com/gpu=N``)
under its own node identity, with no DRA driver, publishing no ResourceSlice.
Its pods are started like any pod without claims; which GPU the device plugin
would hand each container is not modelled (the count is what the scheduler
enforces, and what the tests check).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import pki, procs
from e2e.cluster.handle import Cluster

GPU_RESOURCE = "nvidia.com/gpu"
POOL_LABEL = "gpuplane.dev/node-pool"  # lets a migration test address the pool, as node pools usually are
READY_TIMEOUT_S = 60.0


class LegacyNode:
    """One device-plugin node (``start``/``stop``; the process is ``kubelet-<name>`` in the state's pidfiles)."""

    def __init__(
        self, handle: Cluster, name: str, gpus: int, *, host_ip: str = "127.0.0.250", die_with_parent: bool = False
    ) -> None:
        if handle.state_dir is None:
            raise ValueError("the cluster handle has no state directory")
        self.handle = handle
        self.name = name
        self.gpus = gpus
        self.host_ip = host_ip
        self.die_with_parent = die_with_parent
        self.state_dir = handle.state_dir.resolve()
        self.directory = self.state_dir / "legacy-nodes" / name
        self._child: tuple[subprocess.Popen[bytes], procs.ProcessRecord] | None = None

    @property
    def process(self) -> str:
        """The pidfile name of its kubelet stand-in."""
        return f"kubelet-{self.name}"

    def argv(self, kubeconfig: Path) -> list[str]:
        """The stand-in's command line."""
        return [
            sys.executable,
            "-m",
            "e2e.plane.kubelet",
            f"--node-name={self.name}",
            f"--kubeconfig={kubeconfig}",
            f"--registry-dir={self.directory / 'registry'}",
            f"--cdi-root={self.directory / 'cdi'}",
            f"--host-ip={self.host_ip}",
            f"--capacity={GPU_RESOURCE}={self.gpus}",
            f"--label={POOL_LABEL}=device-plugin",
        ]

    def start(self) -> None:
        """Start the stand-in; return once the Node is Ready and reports its GPUs as allocatable."""
        for sub in ("registry", "cdi"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        pki_dir = self.state_dir / "pki"
        cert = pki.mint_node_cert(pki_dir, self.name)
        server = self.handle.api.configuration.host
        kubeconfig = pki.write_kubeconfig(
            self.directory / "kubeconfig", server, pki_dir / "ca.crt", cert, f"system:node:{self.name}"
        )
        self._child = procs.spawn(
            self.process,
            self.argv(kubeconfig),
            log=self.state_dir / "logs" / f"{self.process}.log",
            pid_dir=self.state_dir / "pids",
            cwd=Path(__file__).resolve().parents[2],
            die_with_parent=self.die_with_parent,
        )
        core = client.CoreV1Api(self.handle.api)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            proc, record = self._child
            if proc.poll() is not None:
                raise procs.ComponentError(self.process, f"exited with code {proc.returncode}", record.log)
            try:
                status = core.read_node(self.name).status
                allocatable = (status.allocatable or {}) if status else {}
                conditions = (status.conditions or []) if status else []
                ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
                if ready and allocatable.get(GPU_RESOURCE) == str(self.gpus):
                    return
            except ApiException as err:
                if err.status != 404:
                    raise
            if time.monotonic() > deadline:
                raise procs.ComponentError(self.process, f"node not Ready after {READY_TIMEOUT_S:.0f}s", record.log)
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop the stand-in and remove the Node (a pool that is gone)."""
        if self._child is not None:
            proc, record = self._child
            procs.stop(record, proc)
            procs.pidfile(self.state_dir / "pids", self.process).unlink(missing_ok=True)
            self._child = None
        try:
            client.CoreV1Api(self.handle.api).delete_node(self.name)
        except ApiException as err:
            if err.status != 404:
                raise
