"""Workload controllers (JobSet, LeaderWorkerSet) running on the loopback control plane.

``Addon(handle, built).start()`` installs what the add-on's Deployment would
find in a real cluster and runs its manager as a local process:

* its CRDs (server-side apply: they are larger than client-side apply's
  annotation limit), waited until Established;
* an identity: a client certificate from the cluster CA for the user
  ``<name>-controller-manager``, bound to the release's own ClusterRole (the
  role its ServiceAccount gets upstream, renamed ``<name>-manager-role``), so
  the manager proves that role is enough;
* its webhook server on loopback with a serving certificate from the cluster
  CA (IP SAN 127.0.0.1); the manager's own certificate rotation is off, and its
  webhook configurations are the release's, with kustomize's patches applied
  (the pod webhooks only see the add-on's pods) and every ``service`` client
  config replaced by ``url: https://127.0.0.1:<port><path>`` plus the CA
  bundle: the apiserver reaches it directly, no Service or kube-proxy needed;
* a ``--config`` file: no leader election (one replica), metrics off, health
  probes on a loopback port.

The process is ``addon-<name>`` in the state directory's pidfiles, so
``python -m e2e down`` stops it with the rest; ``stop()`` also deletes the
webhook configurations (with ``failurePolicy: Fail`` they would refuse the
add-on's objects once nobody answers).
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import addon_build, pki, procs
from e2e.cluster.controlplane import free_port
from e2e.cluster.handle import Cluster

Printer = Callable[[str], None]

READY_TIMEOUT_S = 300.0
"""A manager serves /readyz within seconds on an idle machine; at load 27 on 2 cores LWS had not in 120 s."""
PROCESS_PREFIX = "addon-"


def process_name(name: str) -> str:
    """The pidfile name of add-on ``name``'s manager."""
    return f"{PROCESS_PREFIX}{name}"


def json_patch(document: Any, operations: Sequence[Mapping[str, Any]]) -> Any:
    """``document`` with RFC 6902 ``add``/``replace``/``remove`` operations applied (what kustomize patches use)."""
    out = copy.deepcopy(document)
    for op in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        parent = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                raise ValueError(f"unsupported JSON patch op {kind!r}")
        elif kind in ("add", "replace"):
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[last]
        else:
            raise ValueError(f"unsupported JSON patch op {kind!r}")
    return out


def webhook_configurations(built: addon_build.Built, url_base: str, ca_bundle: str) -> list[dict[str, Any]]:
    """The release's webhook configurations, patched as kustomize would, pointed at ``url_base`` on loopback."""
    r = built.recipe
    docs = [d for d in yaml.safe_load_all(built.manifest(r.webhooks).read_text()) if d]
    out = []
    for raw in docs:
        patch_file = r.webhook_patches.get(raw.get("kind", ""))
        doc = json_patch(raw, yaml.safe_load(built.manifest(patch_file).read_text()) or []) if patch_file else raw
        doc["metadata"] = {"name": f"{r.name}-{doc['metadata']['name']}", "labels": {"app.kubernetes.io/name": r.name}}
        for hook in doc.get("webhooks") or []:
            service = (hook.get("clientConfig") or {}).get("service") or {}
            hook["clientConfig"] = {"url": f"{url_base}{service.get('path', '/')}", "caBundle": ca_bundle}
        out.append(doc)
    return out


def rbac(built: addon_build.Built, user: str) -> list[dict[str, Any]]:
    """The release's manager ClusterRole (renamed) and a binding of it to ``user``."""
    name = f"{built.recipe.name}-manager-role"
    roles = [d for d in yaml.safe_load_all(built.manifest(built.recipe.role).read_text()) if d]
    (role,) = [d for d in roles if d.get("kind") == "ClusterRole"]
    role = {**role, "metadata": {"name": name}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    return [role, binding]


def manager_config(built: addon_build.Built, webhook_port: int, cert_dir: Path, health_port: int) -> dict[str, Any]:
    """The manager's ``--config``: one replica, own cert rotation off, webhook and probes on loopback."""
    return {
        "apiVersion": built.recipe.config_api,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }


def _server_of(kubeconfig: Path) -> str:
    data = yaml.safe_load(kubeconfig.read_text())
    return str(data["clusters"][0]["cluster"]["server"])


class Addon:
    """One add-on's manager on the cluster of ``handle`` (whose state directory holds the PKI)."""

    def __init__(
        self,
        handle: Cluster,
        built: addon_build.Built,
        *,
        die_with_parent: bool = False,
        out: Printer = print,
    ) -> None:
        if handle.state_dir is None:
            raise ValueError("the cluster handle has no state directory (its PKI lives there)")
        self.handle = handle
        self.built = built
        self.state_dir = handle.state_dir.resolve()
        self.die_with_parent = die_with_parent
        self._out = out
        self._child: tuple[subprocess.Popen[bytes], procs.ProcessRecord] | None = None
        self.name = built.recipe.name
        self.user = f"{self.name}-controller-manager"

    @property
    def directory(self) -> Path:
        """Certificates, kubeconfig and config file of this add-on."""
        return self.state_dir / "addons" / self.name

    @property
    def log(self) -> Path:
        """The manager's log."""
        return self.state_dir / "logs" / f"{process_name(self.name)}.log"

    def _apply(self, objects: Sequence[Mapping[str, Any]], *extra: str) -> None:
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        self.handle.kubectl("apply", *extra, "-f", "-", input_text=text, timeout=120)

    def install_crds(self) -> None:
        """Apply the CRDs (server-side) and wait until they are served."""
        names = []
        for path in self.built.crds:
            self.handle.kubectl(
                "apply", "--server-side", "--force-conflicts", "--field-manager=gpuplane-e2e", "-f", str(path)
            )
            names += [d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text()) if d]
        self.handle.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names), timeout=90
        )

    def start(self) -> None:
        """Install, start the manager, wait until it is ready, then register its webhooks."""
        started = time.monotonic()
        record = procs.read_records(self.state_dir / "pids").get(process_name(self.name))
        if record is not None and procs.is_alive(record):
            self._out(f"{self.name}: already running (pid {record.pid})")
            return
        self._out(f"{self.name} {self.built.version}: CRDs, RBAC for user {self.user}, certificates")
        self.install_crds()
        self._apply(rbac(self.built, self.user))
        ca = pki.CertificateAuthority.load(self.state_dir / "pki")
        certs = self.directory / "certs"
        ca.issue(
            certs, "tls", f"{self.name}-webhook", dns_names=("localhost",), ip_addresses=("127.0.0.1",), server=True
        )
        client_pair = ca.issue(self.directory, "client", self.user)
        kubeconfig = pki.write_kubeconfig(
            self.directory / "kubeconfig", _server_of(self.handle.kubeconfig), ca.files.cert, client_pair, self.user
        )
        taken: set[int] = set()
        webhook_port, health_port = free_port(taken), free_port(taken)
        config_file = self.directory / "config.yaml"
        config_file.write_text(yaml.safe_dump(manager_config(self.built, webhook_port, certs, health_port)))
        argv = [
            str(self.built.binary),
            f"--kubeconfig={kubeconfig}",
            f"--config={config_file}",
            "--zap-log-level=info",
            "--zap-devel=false",
        ]
        self._child = procs.spawn(
            process_name(self.name),
            argv,
            log=self.log,
            pid_dir=self.state_dir / "pids",
            cwd=self.directory,
            die_with_parent=self.die_with_parent,
        )
        try:
            self._wait_ready(health_port, started)
            bundle = base64.b64encode(ca.files.cert.read_bytes()).decode()
            self._apply(webhook_configurations(self.built, f"https://127.0.0.1:{webhook_port}", bundle))
        except BaseException:
            self.stop()
            raise
        self._out(f"[{time.monotonic() - started:5.1f}s] {self.name} ready (webhooks on 127.0.0.1:{webhook_port})")

    def _wait_ready(self, port: int, started: float) -> None:
        assert self._child is not None
        proc, record = self._child
        url = f"http://127.0.0.1:{port}/readyz"
        detail = ""
        while True:
            if proc.poll() is not None:
                raise procs.ComponentError(record.name, f"exited with code {proc.returncode}", record.log)
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError) as err:
                detail = str(err)
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise procs.ComponentError(
                    record.name, f"not ready after {READY_TIMEOUT_S:.0f}s ({url}: {detail})", record.log
                )
            time.sleep(0.5)

    def detach(self) -> None:
        """Let the manager outlive this object (``python -m e2e up``)."""
        self._child = None

    def stop(self) -> None:
        """Delete the webhook configurations, then stop the manager."""
        self.handle.kubectl(
            "delete",
            "mutatingwebhookconfigurations,validatingwebhookconfigurations",
            "-l",
            f"app.kubernetes.io/name={self.name}",
            "--ignore-not-found",
            check=False,
        )
        if self._child is not None:
            proc, record = self._child
            procs.stop(record, proc)
            self._child = None
        else:
            left = procs.read_records(self.state_dir / "pids").get(process_name(self.name))
            if left is not None and procs.is_alive(left):
                procs.stop(left)
        procs.pidfile(self.state_dir / "pids", process_name(self.name)).unlink(missing_ok=True)
