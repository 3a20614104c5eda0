"""The driver benchmark's harness: the driver in its own process, scratch directories, and where claims live.

:class:`Driver` starts ``tests/crash_worker.py`` (the production driver on the simulator) and
connects to it as kubelet does; :func:`workdir` gives a short directory and kills the MPS daemons
left under it; :class:`FakeStore` and :class:`ApiStore` hold the benchmark's claims in the
in-memory fake or in a real API server (which it writes to).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from gpuplane.api import names
from gpuplane.driver.host import proc_environ, proc_pids
from gpuplane.driver.plugin.kubelet_client import KubeletPluginClient
from gpuplane.driver.prepare.contract import ClaimRef
from testing.driverkit import FakeClaims, start_worker

REPO = Path(__file__).resolve().parents[2]
NODE = "bench-node"
PROFILE = "hgx-h100"
NAMESPACE = "default"
DEVICE_CLASS = "gpuplane-bench"


class Driver:
    """The driver process and kubelet's connection to it."""

    def __init__(self, root: Path, *, op_latency: float = 0.0, kubeconfig: str | None = None) -> None:
        self.root = root
        extra = ["--op-latency", str(op_latency), "--full-imports", "--noop-plugin"]
        if kubeconfig:
            extra += ["--kubeconfig", kubeconfig]
        self.log = root / "driver.log"
        self.proc, ready = start_worker(root, PROFILE, NODE, self.log, *extra)
        self.pid = int(ready["pid"])
        self.client = KubeletPluginClient.discover(ready["registration_socket"], timeout=60.0)
        self.noop = KubeletPluginClient.discover(ready["noop_registration_socket"], timeout=60.0)

    def stats(self) -> dict[str, Any]:
        """Ask the driver for its simulator/MPS time and resident memory (SIGUSR1)."""
        out = self.root / f"stats-{self.pid}.json"
        out.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not out.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("driver did not report its stats")
            time.sleep(0.005)
        data: dict[str, Any] = json.loads(out.read_text())
        return data

    def prepare(self, refs: Sequence[ClaimRef]) -> None:
        for uid, result in self.client.prepare(refs).items():
            if result.error:
                raise RuntimeError(f"prepare {uid}: {result.error}")

    def unprepare(self, refs: Sequence[ClaimRef]) -> None:
        for uid, result in self.client.unprepare(refs).items():
            if result.error:
                raise RuntimeError(f"unprepare {uid}: {result.error}")

    def close(self) -> None:
        self.client.close()
        self.noop.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _mps_processes(root: Path) -> list[int]:
    prefix = f"{root}/"
    return [pid for pid in proc_pids() if (proc_environ(pid, "CUDA_MPS_PIPE_DIRECTORY") or "").startswith(prefix)]


@contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: unix socket paths
    try:
        yield root
    finally:
        for pid in _mps_processes(root):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


class ClaimStore:
    """Where the bench puts claims and how the floor GETs them (the driver's own client path)."""

    mode = ""

    def add(self, claims: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass


class FakeStore(ClaimStore):
    mode = "in-memory fake API (testing.driverkit.FakeClaims, file-backed so the driver process reads the same claims)"

    def __init__(self, root: Path) -> None:
        self.claims = FakeClaims(root / "claims.json")

    def add(self, claims: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        self.claims.add(*claims)
        return list(claims)

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.claims.get_claim(namespace, name)


class ApiStore(ClaimStore):
    """ResourceClaims in a real API server: spec through the API, allocation through the status subresource."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client

        from gpuplane.driver.kube import GROUP, VERSION, KubeApi, make_api_client

        self.mode = f"real API server (kubeconfig {kubeconfig})"
        self.api = KubeApi(make_api_client(kubeconfig))
        self._group, self._version, self._client = GROUP, VERSION, client
        self.created: list[str] = []
        try:
            self.api.custom.create_cluster_custom_object(
                GROUP,
                VERSION,
                "deviceclasses",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "DeviceClass",
                    "metadata": {"name": DEVICE_CLASS},
                    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRIVER_NAME}"'}}]},
                },
            )
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    def add(self, claims: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for c in claims:
            meta = c["metadata"]
            allocation = c["status"]["allocation"]
            requests = sorted({r["request"] for r in allocation["devices"]["results"]})
            body = {
                "apiVersion": f"{self._group}/{self._version}",
                "kind": "ResourceClaim",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "spec": {
                    "devices": {
                        "requests": [{"name": r, "exactly": {"deviceClassName": DEVICE_CLASS}} for r in requests],
                        "config": [
                            {"requests": [], "opaque": cfg["opaque"]} for cfg in allocation["devices"]["config"]
                        ],
                    }
                },
            }
            made = cast(
                dict[str, Any],
                self.api.custom.create_namespaced_custom_object(
                    self._group, self._version, meta["namespace"], "resourceclaims", body
                ),
            )
            made["status"] = {"allocation": allocation}
            made = cast(
                dict[str, Any],
                self.api.custom.replace_namespaced_custom_object_status(
                    self._group, self._version, meta["namespace"], "resourceclaims", meta["name"], made
                ),
            )
            self.created.append(meta["name"])
            out.append(made)
        return out

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.get_claim(namespace, name)

    def cleanup(self) -> None:
        for name in self.created:
            try:
                self.api.custom.delete_namespaced_custom_object(
                    self._group, self._version, NAMESPACE, "resourceclaims", name
                )
            except self._client.ApiException as exc:
                if exc.status != 404:
                    raise
