"""gpuplane itself on the e2e cluster: installed from ``manifests/``, its programs run under their own identities.

The e2e cluster has no container runtime, so the DaemonSet and the Deployment
of the manifests cannot run here (``manifests/overlays/e2e`` pins them to a
node label no simulated node has and scales the controller to 0). This module
installs that overlay and runs the real programs in their place, each with the
credentials its pod would have:

* ``install(cluster)``: ``kubectl apply -k manifests/overlays/e2e`` (namespace,
  CRDs, DeviceClasses, RBAC, the admission policy, the pinned workloads), then
  waits for the CRDs and both service accounts;
* ``driver_credentials(cluster, dir)``: the ``simnodes.DriverCredentials`` that
  gives each node's ``gpuplane-driver`` a ``gpuplane-driver`` token bound to a
  stand-in pod on that node (``e2e.plane.identity``), so the admission policy sees the
  node's name as it would for a DaemonSet pod;
* ``Controllers(state_dir, cluster)``: ``gpuplane-controller`` replicas
  (processes ``controller-<i>``, pidfiles and logs in the state directory, as
  ``e2e.cluster.procs`` keeps them) under one ``gpuplane-controller`` token, electing
  their leader on the Lease ``gpuplane-system/gpuplane-controller``;
  ``stop_controllers(state_dir)`` stops them from another process (``down``).

Tokens come from the TokenRequest API and expire: ``identity.TOKEN_SECONDS``
(1 h) for tests, ``identity.LONG_TOKEN_SECONDS`` (24 h) for a cluster left
running; the programs read their kubeconfig once, so a cluster older than that
needs ``down`` and ``up`` again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import procs
from e2e.cluster.controlplane import free_port
from e2e.cluster.handle import Cluster
from e2e.plane import identity, simnodes
from e2e.plane import install as installer

Printer = Callable[[str], None]

REPO_ROOT = Path(__file__).resolve().parents[2]
OVERLAY = REPO_ROOT / "manifests" / "overlays" / "e2e"
LEASE_NAME = "gpuplane-controller"
CONTROLLER_PREFIX = "controller-"
DEFAULT_REPLICAS = 2
LEADER_TIMEOUT_S = 60.0


def identities_dir(state_dir: Path) -> Path:
    """Where the token kubeconfigs of the drivers and the controller are written."""
    return state_dir / "identities"


def install(cluster: Cluster, out: Printer = print, overlay: Path = OVERLAY) -> None:
    """``kubectl apply -k <overlay>``; wait until its CRDs are served and the service accounts exist."""
    out(f"install: kubectl apply -k {overlay.relative_to(REPO_ROOT) if overlay.is_relative_to(REPO_ROOT) else overlay}")
    installer.apply(cluster, overlay)
    installer.wait_established(cluster, installer.crd_names(installer.render(cluster, overlay)))
    for account in (identity.DRIVER_SA, identity.CONTROLLER_SA):
        identity.wait_service_account(cluster.api, identity.NAMESPACE, account)


def driver_credentials(
    cluster: Cluster, out_dir: Path, *, seconds: int = identity.TOKEN_SECONDS
) -> simnodes.DriverCredentials:
    """Credentials for each node's driver: its service account's token, bound to a stand-in pod on the node."""

    def credentials(node: simnodes.SimNode, access: simnodes.ClusterAccess) -> Path:
        del access
        return identity.driver_identity(cluster, node.name, out_dir, seconds=seconds).kubeconfig

    return credentials


def _controller_command() -> list[str]:
    script = Path(sys.executable).with_name("gpuplane-controller")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gpuplane.controller.main"]


def controller_argv(
    kubeconfig: Path, replica: str, metrics_port: int, health_port: int, move_ledger: Path | None = None
) -> list[str]:
    """The command line of one controller replica (its identity is the name a pod would have).

    Noisy-neighbour moves use e2e timings (an alert must stand 5 s, not 60; a GPU cools down
    60 s, not 300), and their ledger is ``move_ledger``.
    """
    return [
        *_controller_command(),
        f"--kubeconfig={kubeconfig}",
        f"--identity={replica}",
        f"--lease-namespace={identity.NAMESPACE}",
        f"--metrics-port={metrics_port}",
        "--metrics-auth=none",  # loopback plain HTTP (development); the Deployment wants a token
        f"--liveness=http://127.0.0.1:{health_port}/healthz",
        "--log-format=json",
        "--noisy-persist=5",
        "--rebalance-interval=1",
        "--rebalance-cooldown=60",
        "--imex-ready-timeout=60",  # a gang whose IMEX domain is not ready a minute after placement is released
        "--mig-offer-gpus-per-namespace=4",  # the e2e fleet has 24 MIG-capable GPUs: the bound shows at this size
        *([f"--move-ledger={move_ledger}"] if move_ledger else []),
    ]


def lease_holder(api: client.ApiClient) -> str:
    """Who holds the controller's leader Lease ('' when nobody does yet)."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE_NAME, identity.NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return ""
        raise
    return str((lease.spec and lease.spec.holder_identity) or "")


def controller_records(state_dir: Path) -> dict[str, procs.ProcessRecord]:
    """Pidfile records of the controller replicas of ``state_dir``."""
    return {
        name: record
        for name, record in procs.read_records(state_dir / "pids").items()
        if name.startswith(CONTROLLER_PREFIX)
    }


def stop_controllers(state_dir: Path, out: Printer = print) -> list[str]:
    """Stop every controller replica recorded in ``state_dir`` (SIGTERM: the leader releases its Lease)."""
    stopped = []
    for name, record in sorted(controller_records(state_dir).items()):
        if procs.is_alive(record):
            out(f"stopping {name} (pid {record.pid})")
            procs.stop(record)
            stopped.append(name)
        procs.pidfile(state_dir / "pids", name).unlink(missing_ok=True)
    return stopped


class Controllers:
    """``gpuplane-controller`` replicas as local processes under the controller's service account."""

    def __init__(
        self,
        state_dir: Path,
        cluster: Cluster,
        *,
        replicas: int = DEFAULT_REPLICAS,
        token_seconds: int = identity.TOKEN_SECONDS,
        die_with_parent: bool = False,
        env: Mapping[str, str] | None = None,
        out: Printer = print,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.cluster = cluster
        self.replicas = replicas
        self.env = None if not env else {**os.environ, **env}  # extra environment (a diagnosis run's tracing)
        self.token_seconds = token_seconds
        self.die_with_parent = die_with_parent
        self._out = out
        self._children: dict[str, tuple[subprocess.Popen[bytes], procs.ProcessRecord]] = {}

    @staticmethod
    def replica_name(index: int) -> str:
        """The identity of replica ``index`` (what a Deployment pod's name would be)."""
        return f"gpuplane-controller-{index}"

    def log(self, index: int) -> Path:
        """The log of replica ``index``."""
        return self.state_dir / "logs" / f"{CONTROLLER_PREFIX}{index}.log"

    def move_ledger(self, index: int) -> Path:
        """The ledger of noisy-neighbour moves replica ``index`` makes while it leads."""
        return self.state_dir / "logs" / f"{CONTROLLER_PREFIX}{index}-moves.jsonl"

    def all_running(self) -> bool:
        """Whether every replica recorded in the state directory runs (and there are ``replicas`` of them)."""
        records = controller_records(self.state_dir)
        return len(records) == self.replicas and all(procs.is_alive(r) for r in records.values())

    def start(self) -> list[str]:
        """Mint the controller's token, start the replicas, wait until one of them holds the Lease."""
        if self.replicas <= 0:
            return []
        stop_controllers(self.state_dir, out=self._out)
        who = identity.controller_identity(self.cluster, identities_dir(self.state_dir), seconds=self.token_seconds)
        started = time.monotonic()
        names: list[str] = []
        taken: set[int] = set()
        try:
            for index in range(self.replicas):
                replica = self.replica_name(index)
                argv = controller_argv(
                    who.kubeconfig, replica, free_port(taken), free_port(taken), self.move_ledger(index)
                )
                name = f"{CONTROLLER_PREFIX}{index}"
                self._children[name] = procs.spawn(
                    name,
                    argv,
                    log=self.log(index),
                    pid_dir=self.state_dir / "pids",
                    env=self.env,
                    cwd=REPO_ROOT,
                    die_with_parent=self.die_with_parent,
                )
                names.append(replica)
            self._wait_leader(names, started)
        except BaseException:
            self.stop()
            raise
        return names

    def _wait_leader(self, names: Sequence[str], started: float) -> None:
        while True:
            for name, (proc, record) in self._children.items():
                if proc.poll() is not None:
                    raise procs.ComponentError(name, f"exited with code {proc.returncode}", record.log)
            holder = lease_holder(self.cluster.api)
            if holder in names:
                lease = f"{identity.NAMESPACE}/{LEASE_NAME}"
                self._out(f"[{time.monotonic() - started:5.1f}s] controller leader: {holder} (Lease {lease})")
                return
            if time.monotonic() - started > LEADER_TIMEOUT_S:
                first = next(iter(self._children.values()))[1]
                raise procs.ComponentError(
                    first.name, f"no replica took the Lease in {LEADER_TIMEOUT_S:.0f}s (holder {holder!r})", first.log
                )
            time.sleep(0.5)

    def detach(self) -> None:
        """Let the replicas outlive this object (``python -m e2e up``)."""
        self._children.clear()

    def stop(self) -> None:
        """Stop the replicas this object started."""
        for name, (proc, record) in list(self._children.items()):
            procs.stop(record, proc)
            procs.pidfile(self.state_dir / "pids", name).unlink(missing_ok=True)
            del self._children[name]
