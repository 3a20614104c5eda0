"""Simulated GPU nodes: a real ``gpuplane-driver`` (simulator backend) and a kubelet stand-in per node.

``SimNodes(state_dir, kubeconfig).start(groups)`` plans one node per count of
each ``NodeGroup`` (names ``<profile>-<i>``), gives each its own directories,
and starts per node

* ``driver-<node>``: ``gpuplane-driver --backend sim`` with its own registry,
  plugin, CDI and simulator state directories, the repository's MPS stand-in
  (``tests/fakes/nvidia-cuda-mps-control``) and a metrics port;
* ``kubelet-<node>``: ``python -m e2e.plane.kubelet`` with a node client certificate
  (``system:node:<name>``), which registers the driver, keeps the Node Ready and
  runs the pods bound to it;

both through ``e2e.cluster.procs`` (pidfiles in ``state_dir/pids``, logs in ``state_dir/logs``), so
``python -m e2e down`` stops them with the control plane. ``start`` returns once every Node is Ready,
every driver is registered with its stand-in and every node's ResourceSlice pool is complete.

The plan (names, directories, sockets, racks: one NVL72 rack's nodes share a fabric cluster UUID
and clique id, in a ``--sim-config`` file) is :mod:`e2e.plane.simnode_plan`'s. Layout:
``state_dir/nodes/<node>/`` holds the CDI root (``cdi``), simulator state (``sim``), simulator config
(``sim.yaml``), the stand-in's kubeconfig and status file; the unix sockets (registration dir ``r``,
plugin dir ``p`` with the MPS pipes) live under the node's socket dir; the plan in ``nodes.json``.

The driver's API credentials come from a ``DriverCredentials`` function called once per node before
its driver starts: ``e2e.plane.components.driver_credentials`` (``up``/``demo``, ``gpu_cluster``) gives
the ``gpuplane-driver`` ServiceAccount's token bound to a stand-in pod on the node, so the admission
policy in ``manifests/policies`` confines the driver to its own node's ResourceSlices; the default,
``admin_credentials``, the admin kubeconfig (for tests that install no RBAC).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config

from e2e.cluster import pki, procs
from e2e.plane import nodes
from e2e.plane.plan_files import GB200_RACK_NODES
from e2e.plane.simnode_plan import (
    ClusterAccess,
    DriverCredentials,
    SimNode,
    admin_credentials,
    load_nodes,
    nodes_file,
    plan_nodes,
    save_nodes,
    socket_root,
)
from gpuplane.api import names
from gpuplane.driver.sharing.mps import MpsControl

__all__ = [  # the plan's names are imported from here by the harness and the tests
    "DEFAULT_NODE_SPEC",
    "MPS_STANDIN",
    "ClusterAccess",
    "DriverCredentials",
    "SimNode",
    "SimNodes",
    "admin_credentials",
    "load_nodes",
    "nodes_file",
    "socket_root",
    "stop_nodes",
]

Printer = Callable[[str], None]

DEFAULT_NODE_SPEC = "hgx-h100:2,gb200-nvl72:2,a100-40gb:1"
"""The demo's mix: two 8-GPU H100 boxes (MIG + MPS + NVLink), two GB200 trays of one NVL72 rack (the gang-tp8
example needs both: 2 members x 4 GPUs in one NVLink domain), one A100 node."""

REPO_ROOT = Path(__file__).resolve().parents[2]
MPS_STANDIN = REPO_ROOT / "tests" / "fakes" / "nvidia-cuda-mps-control"
IMEX_STANDIN = REPO_ROOT / "tests" / "fakes" / "nvidia-imex"
IMEX_CTL_STANDIN = REPO_ROOT / "tests" / "fakes" / "nvidia-imex-ctl"
IMEX_CONTROL_ENV = "GPUPLANE_IMEX_STANDIN_CONTROL"
READY_TIMEOUT_S = 180.0
PROGRESS_EVERY_S = 15.0


def _driver_command() -> list[str]:
    script = Path(sys.executable).with_name("gpuplane-driver")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gpuplane.driver.main"]


def driver_argv(node: SimNode, kubeconfig: Path, extra: Sequence[str] = ()) -> list[str]:
    """The driver's command line for ``node`` (``extra``: more flags, e.g. ``--steer-order``)."""
    argv = [
        *_driver_command(),
        f"--node-name={node.name}",
        f"--kubeconfig={kubeconfig}",
        "--backend=sim",
        f"--sim-profile={node.profile}",
        f"--sim-state-dir={node.sim_state_dir}",
        f"--registry-dir={node.registry_dir}",
        f"--plugin-dir={node.plugin_dir}",
        f"--cdi-root={node.cdi_root}",
        f"--mps-control-binary={MPS_STANDIN}",
        f"--metrics-address=127.0.0.1:{node.metrics_port}",
        "--metrics-auth=none",  # loopback plain HTTP (development); the DaemonSet wants a token
        "--log-format=json",
    ]
    if node.sim_config:
        argv.append(f"--sim-config={node.sim_config_file}")
    if node.imex_port:  # a GB200 tray: its nvidia-imex (the stand-in) as the driver's child, prepare awaits it
        argv += [
            "--imex-daemons=process",
            f"--imex-binary={IMEX_STANDIN}",
            f"--imex-ctl-binary={IMEX_CTL_STANDIN}",
            f"--imex-port={node.imex_port}",
        ]
    return [*argv, *extra]


def driver_env(node: SimNode) -> dict[str, str] | None:
    """The driver's environment: a tray's carries the IMEX stand-in's control directory (its daemons inherit it)."""
    if not node.imex_port:
        return None
    return {**os.environ, IMEX_CONTROL_ENV: str(node.imex_control_dir)}


def kubelet_argv(node: SimNode) -> list[str]:
    """The kubelet stand-in's command line for ``node``."""
    argv = [
        sys.executable,
        "-m",
        "e2e.plane.kubelet",
        f"--node-name={node.name}",
        f"--kubeconfig={node.kubelet_kubeconfig}",
        f"--registry-dir={node.registry_dir}",
        f"--cdi-root={node.cdi_root}",
        f"--host-ip={node.host_ip}",
        f"--status-file={node.kubelet_status}",
    ]
    argv += [f"--label={key}={value}" for key, value in sorted(node.labels.items())]
    return argv


def _prepare_dirs(node: SimNode, access: ClusterAccess) -> None:
    for directory in (node.node_dir, node.registry_dir, node.plugin_dir, node.cdi_root, node.sim_state_dir):
        directory.mkdir(parents=True, exist_ok=True)
    if node.imex_port:
        node.imex_control_dir.mkdir(exist_ok=True)
    node.kubelet_status.unlink(missing_ok=True)
    if node.sim_config:
        node.sim_config_file.write_text(yaml.safe_dump(dict(node.sim_config), sort_keys=True))
    cert = pki.mint_node_cert(access.pki_dir, node.name)
    pki.write_kubeconfig(node.kubelet_kubeconfig, access.server, access.ca_cert, cert, f"system:node:{node.name}")


def stop_mps_daemons(node: SimNode) -> list[str]:
    """Stop the node's MPS control daemons (they run in their own sessions and outlive the driver)."""
    if not node.mps_root.is_dir():
        return []
    return MpsControl(node.mps_root, str(MPS_STANDIN)).cleanup_orphans(keep=set())


def stop_nodes(state_dir: Path, out: Printer = print) -> list[str]:
    """Stop every node process recorded in ``state_dir`` and the MPS daemons their drivers left."""
    pid_dir = state_dir / "pids"
    records = procs.read_records(pid_dir)
    stopped = []
    planned = load_nodes(state_dir)
    names_ = [n.kubelet_process for n in planned] + [n.driver_process for n in planned]
    names_ += [name for name in records if name.startswith(("kubelet-", "driver-")) and name not in names_]
    for name in names_:
        record = records.get(name)
        if record is None:
            continue
        if procs.is_alive(record):
            out(f"stopping {name} (pid {record.pid})")
            procs.stop(record)
            stopped.append(name)
        procs.pidfile(pid_dir, name).unlink(missing_ok=True)
    for node in planned:
        gone = stop_mps_daemons(node)
        if gone:
            out(f"stopped {len(gone)} MPS daemon(s) of {node.name}")
    return stopped


class SimNodes:
    """Start, watch and stop the simulated nodes of one cluster."""

    def __init__(
        self,
        state_dir: Path,
        kubeconfig: Path,
        *,
        driver_credentials: DriverCredentials = admin_credentials,
        die_with_parent: bool = False,
        ready_timeout: float = READY_TIMEOUT_S,
        rack_nodes: int = GB200_RACK_NODES,
        driver_args: Sequence[str] = (),
        out: Printer = print,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.rack_nodes = rack_nodes
        self.driver_args = tuple(driver_args)
        self.access = ClusterAccess.from_state_dir(self.state_dir, Path(kubeconfig))
        self.driver_credentials = driver_credentials
        self.die_with_parent = die_with_parent
        self.ready_timeout = ready_timeout
        self._out = out
        self.nodes: list[SimNode] = load_nodes(self.state_dir)
        """Every node recorded for the state directory (names stay taken once used)."""
        self.started: list[SimNode] = []
        """The nodes this object started: what ``stop`` stops and removes."""
        self._children: dict[str, tuple[Any, procs.ProcessRecord]] = {}

    @property
    def log_dir(self) -> Path:
        """Component logs (shared with the control plane)."""
        return self.state_dir / "logs"

    def log(self, process: str) -> Path:
        """The log of a node process (``driver-<node>`` / ``kubelet-<node>``)."""
        return self.log_dir / f"{process}.log"

    def node(self, name: str) -> SimNode:
        """The node called ``name``."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def running(self) -> list[str]:
        """Node process names that run now."""
        records = procs.read_records(self.state_dir / "pids")
        wanted = [p for n in self.nodes for p in (n.driver_process, n.kubelet_process)]
        return [p for p in wanted if p in records and procs.is_alive(records[p])]

    def all_running(self) -> bool:
        """Whether every planned node's two processes run."""
        return bool(self.nodes) and len(self.running()) == 2 * len(self.nodes)

    def start(self, groups: Sequence[nodes.NodeGroup]) -> list[SimNode]:
        """Start the nodes of ``groups`` (added to any already recorded) and wait until they are usable."""
        if not groups:
            return []
        started = time.monotonic()
        renumbered = plan_nodes(self.state_dir, groups, existing=load_nodes(self.state_dir), rack_nodes=self.rack_nodes)
        self.nodes = [*load_nodes(self.state_dir), *renumbered]
        self.started.extend(renumbered)
        save_nodes(self.state_dir, self.nodes)
        try:
            for node in renumbered:
                self._out(f"node {node.name}: {node.profile}, sockets in {node.socket_dir}, address {node.host_ip}")
                _prepare_dirs(node, self.access)
                self._spawn(
                    node.driver_process,
                    driver_argv(node, self.driver_credentials(node, self.access), self.driver_args),
                )
                self._spawn(node.kubelet_process, kubelet_argv(node))
            self._wait_ready(renumbered, started)
        except BaseException:
            self.stop()
            raise
        return renumbered

    def detach(self) -> None:
        """Let the processes outlive this object (``python -m e2e up``)."""
        self._children.clear()

    def stop(self, *, remove: bool = True) -> None:
        """Stop the nodes this object started: processes, MPS daemons and (``remove``) their Node and slices.

        Removing them from the API is what taking a node out of a cluster does: the scheduler no
        longer sees its devices, so later users of the same control plane (other test modules)
        cannot get pods bound to a node nobody runs. An object that started nothing stops every
        node recorded in the state directory (as ``python -m e2e down`` does) and removes nothing.
        """
        for name, (proc, record) in list(self._children.items()):
            procs.stop(record, proc)
            procs.pidfile(self.state_dir / "pids", name).unlink(missing_ok=True)
            del self._children[name]
        if not self.started:
            stop_nodes(self.state_dir, out=self._out)
            return
        records = procs.read_records(self.state_dir / "pids")
        for node in self.started:
            for name in (node.kubelet_process, node.driver_process):
                found = records.get(name)
                if found is not None:
                    if procs.is_alive(found):
                        procs.stop(found)
                    procs.pidfile(self.state_dir / "pids", name).unlink(missing_ok=True)
            stop_mps_daemons(node)
        if remove:
            self._remove_from_api(self.started)

    def _remove_from_api(self, gone: Sequence[SimNode]) -> None:
        nodes.remove_from_api(self.access.admin_kubeconfig, [n.name for n in gone], self._out)

    def restart(self, name: str, while_stopped: Callable[[], object] | None = None) -> procs.ProcessRecord:
        """Stop one process of a node (``node.driver_process`` or ``node.kubelet_process``), start it again.

        ``while_stopped`` runs in between (e.g. to damage a file the running process would rewrite or read).
        """
        record = procs.read_records(self.state_dir / "pids")[name]
        procs.stop(record, child[0] if (child := self._children.get(name)) else None)
        if while_stopped is not None:
            while_stopped()
        self._spawn(name, list(record.argv))
        return self._children[name][1]

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = next((driver_env(n) for n in self.nodes if n.driver_process == name), None)
        proc, record = procs.spawn(
            name,
            argv,
            log=self.log(name),
            pid_dir=self.state_dir / "pids",
            env=env,
            cwd=REPO_ROOT,
            die_with_parent=self.die_with_parent,
        )
        self._children[name] = (proc, record)

    def _check_alive(self, pending: Iterable[SimNode]) -> None:
        records = procs.read_records(self.state_dir / "pids")
        for node in pending:
            for name in (node.driver_process, node.kubelet_process):
                record = records.get(name)
                if record is None or not procs.is_alive(record):
                    raise procs.ComponentError(name, "exited during start-up", self.log(name))

    def _wait_ready(self, pending_nodes: Sequence[SimNode], started: float) -> None:
        load: Callable[..., client.ApiClient] = config.new_client_from_config
        api = load(config_file=str(self.access.admin_kubeconfig), persist_config=False)
        custom = client.CustomObjectsApi(api)
        pending = {n.name: n for n in pending_nodes}
        problems: dict[str, str] = {}
        last_note = time.monotonic()
        try:
            while pending:
                self._check_alive(pending.values())
                for name, node in list(pending.items()):
                    problem = _node_problem(node, custom)
                    if problem is None:
                        del pending[name]
                        self._out(f"[{time.monotonic() - started:5.1f}s] node {name} ready")
                    else:
                        problems[name] = problem
                if not pending:
                    break
                now = time.monotonic()
                if now - started > self.ready_timeout:
                    detail = "; ".join(f"{n}: {problems.get(n, '?')}" for n in sorted(pending))
                    first = next(iter(sorted(pending)))
                    raise procs.ComponentError(
                        f"driver-{first}",
                        f"nodes not ready after {self.ready_timeout:.0f}s ({detail})",
                        self.log(f"driver-{first}"),
                    )
                if now - last_note > PROGRESS_EVERY_S:
                    last_note = now
                    self._out(
                        f"[{now - started:5.1f}s]   waiting for {len(pending)} node(s): "
                        + ", ".join(f"{n} ({problems.get(n, '?')})" for n in sorted(pending))
                    )
                time.sleep(0.5)
        finally:
            close: Callable[[], None] = api.close
            close()


def _node_problem(node: SimNode, custom: client.CustomObjectsApi) -> str | None:
    """Why ``node`` is not usable yet, or None when it is."""
    try:
        status = json.loads(node.kubelet_status.read_text())
    except (OSError, ValueError):
        return "kubelet stand-in not ready"
    if names.DRIVER_NAME not in status.get("plugins", []):
        return "driver not registered with the kubelet stand-in"
    listed = cast(
        dict[str, Any],
        custom.list_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={node.name}"
        ),
    )
    pool = [s for s in listed.get("items", []) if s["spec"]["pool"]["name"] == node.name]
    if not pool:
        return "no ResourceSlices yet"
    generation = max(int(s["spec"]["pool"]["generation"]) for s in pool)
    current = [s for s in pool if int(s["spec"]["pool"]["generation"]) == generation]
    expected = int(current[0]["spec"]["pool"]["resourceSliceCount"])
    if len(current) < expected:
        return f"{len(current)}/{expected} ResourceSlices"
    return None
