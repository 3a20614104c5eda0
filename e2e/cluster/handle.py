"""A handle on a running cluster for tests and tools: kubeconfig, kubectl, API clients.

``Cluster.connect(kubeconfig, bins)`` builds one API client for the lifetime of
the handle (``close()`` releases it). ``kubectl(*args)`` runs the kubectl built
with the control plane against the same kubeconfig.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from e2e.cluster.build import BinPaths


class KubectlError(RuntimeError):
    """kubectl exited non-zero."""


@dataclasses.dataclass
class Cluster:
    """A running cluster: where its kubeconfig is, and clients for it."""

    kubeconfig: Path
    bins: BinPaths
    api: client.ApiClient
    state_dir: Path | None = None

    @classmethod
    def connect(cls, kubeconfig: Path, bins: BinPaths, state_dir: Path | None = None) -> Cluster:
        """Create the API client for ``kubeconfig``."""
        # The kubernetes package leaves these two untyped; give them their real types once.
        load: Callable[..., client.ApiClient] = config.new_client_from_config
        api = load(config_file=str(kubeconfig), persist_config=False)
        return cls(kubeconfig=kubeconfig, bins=bins, api=api, state_dir=state_dir)

    def close(self) -> None:
        """Release the API client's connections."""
        close: Callable[[], None] = self.api.close
        close()

    @property
    def core(self) -> client.CoreV1Api:
        """core/v1 on the shared client."""
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        """Untyped access to any group/version (used for resource.k8s.io) on the shared client."""
        return client.CustomObjectsApi(self.api)

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True, timeout: float = 60) -> str:
        """Run kubectl with this cluster's kubeconfig; return stdout (raise KubectlError on failure)."""
        cmd = [str(self.bins.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        done = subprocess.run(cmd, input=input_text, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise KubectlError(f"`kubectl {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def apply(self, manifest: dict[str, Any] | str) -> str:
        """``kubectl apply -f -`` for a YAML string or a single object."""
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.kubectl("apply", "-f", "-", input_text=text)
