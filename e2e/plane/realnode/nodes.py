"""Real nodes on this machine: a real kubelet and containerd per node, and gpuplane's driver on its simulator.

``RealNodes(state_dir, kubeconfig).start(groups)`` checks the machine
(``host.require``), builds or finds the binaries and images, plans the nodes
(``plan``: names ``<profile>-real-<n>``, a free /24 each, a bridge made under a
machine-wide lock), and starts per node, through ``e2e.cluster.procs`` (pidfiles in
``<state>/pids``, logs ``<state>/logs/{containerd,kubelet,driver}-<node>.log``):

1. ``containerd-<node>`` with its own root, state and socket, and the pause and
   busybox images imported;
2. ``kubelet-<node>`` (the real kubelet of ``release``, default the running one), which creates the
   Node and keeps it Ready under its node certificate ``system:node:<node>``;
3. ``driver-<node>``: ``gpuplane-driver --backend=sim`` as a host process under
   the credentials ``driver_credentials`` returns (``python -m e2e up`` and the
   e2e fixtures: the ``gpuplane-driver`` ServiceAccount's token bound to a pod on
   the node), with its registration and plugin directories in the kubelet's
   root, so the real kubelet's plugin watcher registers it.

``start`` returns when every Node is Ready, kubelet has registered every driver
and every node's ResourceSlice pool is complete. ``upgrade_kubelet`` replaces a
node's kubelet by another release's, in place. ``stop`` (or ``stop_nodes`` from
another process, as ``python -m e2e down`` does) takes them off the machine again
(``teardown``). ``import_archive(state_dir, archive)`` imports an image archive
into every real node's containerd; ``RealNode.kubelet_root`` is each node's
kubelet root dir (for a DaemonSet's hostPath volumes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import build, pki, procs, releases
from e2e.cluster.realnode import binaries, cgroups, containerd, host, images, kubeletconf, network
from e2e.plane import identity, nodes
from e2e.plane.realnode import commands, plan, readiness, teardown
from e2e.plane.realnode.plan import RealNode

Printer = Callable[[str], None]
DriverCredentials = Callable[[RealNode], Path]
"""Returns the kubeconfig a real node's driver runs with."""

REPO_ROOT = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 180.0


def stop_nodes(state_dir: Path, out: Printer = print) -> list[str]:
    """Take every real node recorded in ``state_dir`` off the machine; return the processes stopped."""
    stopped: list[str] = []
    left: list[str] = []
    for node in plan.load(state_dir):
        stopped += teardown.stop_processes(node, state_dir / "pids", out)
        problems = teardown.remove_host_state(node, out)
        left += problems
        for problem in problems:
            out(f"{node.name}: could not clean up: {problem}")
    if not left:
        plan.plan_file(state_dir).unlink(missing_ok=True)
    return stopped


def import_archive(state_dir: Path, archive: Path, out: Printer = print) -> dict[str, list[str]]:
    """Import an OCI or Docker image archive into the containerd of every real node of ``state_dir``.

    Returns node name -> image names imported. The images land in the CRI namespace ``k8s.io``,
    where kubelet finds them (use ``imagePullPolicy: IfNotPresent`` or ``Never``).
    """
    bins = binaries.ensure_node_binaries(out=out)
    done = {}
    for node in plan.load(state_dir):
        done[node.name] = containerd.import_archive(bins.ctr, node.containerd_socket, archive)
        out(f"{node.name}: imported {', '.join(done[node.name])} from {archive}")
    return done


class RealNodes:
    """Start, watch and stop the real nodes of one cluster."""

    def __init__(
        self,
        state_dir: Path,
        kubeconfig: Path,
        *,
        driver_credentials: DriverCredentials,
        release: releases.Release = releases.RUNNING,
        feature_gates: Mapping[str, bool] | None = None,
        driver_env: Mapping[str, str] | None = None,
        die_with_parent: bool = False,
        ready_timeout: float = READY_TIMEOUT_S,
        out: Printer = print,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.access = commands.Access.of(self.state_dir, Path(kubeconfig))
        self.driver_credentials = driver_credentials
        self.release = release
        """The Kubernetes release of the kubelets (its build and feature gates); ``upgrade_kubelet`` moves it."""
        self.feature_gates = dict(release.feature_gates if feature_gates is None else feature_gates)
        self.driver_env = dict(driver_env or {})
        """Extra environment of the drivers (``GPUPLANE_*`` settings, e.g. short health timings for tests)."""
        self.die_with_parent = die_with_parent
        self.ready_timeout = ready_timeout
        self._out = out
        self.nodes: list[RealNode] = plan.load(self.state_dir)
        self.started: list[RealNode] = []
        self.bins: binaries.NodeBinaries | None = None
        self.ready_seconds: dict[str, float] = {}
        """Seconds from the first process start to each node's Ready condition (kubelet's own)."""
        self._children: dict[str, tuple[Any, procs.ProcessRecord]] = {}

    @property
    def pid_dir(self) -> Path:
        """Pidfiles (shared with the control plane)."""
        return self.state_dir / "pids"

    def log(self, process: str) -> Path:
        """The log of a node process."""
        return commands.log_path(self.state_dir, process)

    def node(self, name: str) -> RealNode:
        """The real node called ``name``."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def all_running(self, *, host_driver: bool = True) -> bool:
        """Whether every planned node's three processes run (``host_driver=False``: kubelet and containerd)."""
        records = procs.read_records(self.pid_dir)
        wanted = [p for n in self.nodes for p in n.processes[0 if host_driver else 1 :]]
        return bool(wanted) and all(p in records and procs.is_alive(records[p]) for p in wanted)

    def start(self, groups: Sequence[nodes.NodeGroup], *, host_driver: bool = True) -> list[RealNode]:
        """Start the real nodes of ``groups`` and wait until they are usable.

        ``host_driver=False``: no driver process; the nodes are Ready and wait for the driver's
        DaemonSet (``e2e.plane.realinstall``), as a freshly joined node of a real cluster does.
        """
        if not groups:
            return []
        host.require()
        began = time.monotonic()
        bins = binaries.ensure_node_binaries(out=self._out, k8s_module_dir=self.release.module_dir)
        self.bins = bins
        archives = images.node_images(bins.pause, build.cache_root(os.environ), out=self._out)
        runc = host.runc_path()
        assert runc is not None  # host.require checked it
        existing = plan.load(self.state_dir)
        with network.allocation_lock():
            planned = plan.plan_nodes(self.state_dir, groups, existing, sorted(network.networks_in_use(), key=str))
            self.nodes = [*existing, *planned]
            self.started.extend(planned)
            plan.save(self.state_dir, self.nodes)
            for node in planned:
                network.make_bridge(node.bridge, node.ip_network)
        began_nodes = time.monotonic()
        try:
            for node in planned:
                self._start_runtime(node, bins, runc, archives)
            self.ready_seconds.update(self._wait(planned, began_nodes, self._ready, "Ready", 1))
            if host_driver:
                for node in planned:
                    self._start_driver(node)
                self._wait(planned, began_nodes, self._published, "driver registered by kubelet, slices published", 0)
        except BaseException:
            self.stop()
            raise
        self._out(f"real nodes up in {time.monotonic() - began:.1f}s: {', '.join(n.name for n in planned)}")
        return planned

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        self._children[name] = procs.spawn(
            name,
            argv,
            log=self.log(name),
            pid_dir=self.pid_dir,
            env=env,
            cwd=REPO_ROOT,
            die_with_parent=self.die_with_parent,
        )

    def _start_runtime(
        self, node: RealNode, bins: binaries.NodeBinaries, runc: Path, archives: Sequence[images.ImageArchive]
    ) -> None:
        shutil.rmtree(node.node_dir, ignore_errors=True)
        for directory in (node.node_dir, node.cdi_root, node.sim_state_dir, node.ipam_dir, node.base_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if node.sim_config:
            node.sim_config_file.write_text(yaml.safe_dump(dict(node.sim_config), sort_keys=True))
        self._out(
            f"node {node.name}: {node.profile}, InternalIP {node.node_ip} (bridge {node.bridge}, pods "
            f"{node.subnet}), cgroup {node.cgroup_root}, kubelet root {node.kubelet_root}"
        )
        layout = host.cgroup_layout()
        cgroups.create(node.cgroup_root, layout)
        network.write_conflist(
            node.cni_conf_dir, network.conflist(node.network, node.bridge, node.ip_network, node.ipam_dir)
        )
        paths = containerd.ContainerdPaths(
            root=node.containerd_root,
            state=node.containerd_state,
            socket=node.containerd_socket,
            cni_conf_dir=node.cni_conf_dir,
            cdi_dir=node.cdi_root,
            opt_dir=node.containerd_root / "opt",
        )
        node.containerd_config.write_text(containerd.config(paths, runc, host.CNI_BIN_DIR))
        env = commands.process_env(bins)
        name_ctrd, name_kubelet = node.processes[2], node.processes[1]
        self._spawn(name_ctrd, [str(bins.containerd), f"--config={node.containerd_config}"], env)
        containerd.wait_ready(bins.ctr, node.containerd_socket, alive=lambda: self._alive(node.name))
        for archive in archives:
            containerd.import_archive(bins.ctr, node.containerd_socket, archive.archive)
        cert = pki.mint_node_cert(self.access.pki_dir, node.name)
        pki.write_kubeconfig(
            node.kubelet_kubeconfig, self.access.server, self.access.ca_cert, cert, f"system:node:{node.name}"
        )
        settings = kubeletconf.KubeletSettings(
            node_name=node.name,
            node_ip=node.node_ip,
            root_dir=node.kubelet_root,
            kubeconfig=node.kubelet_kubeconfig,
            client_ca=self.access.ca_cert,
            runtime_socket=node.containerd_socket,
            cgroup_root=node.cgroup_root,
            port=node.kubelet_port,
            healthz_port=node.healthz_port,
            feature_gates=self.feature_gates,
            labels=node.labels,
            cgroup_v1=not layout.is_v2,
        )
        kubeletconf.write_configuration(node.kubelet_config, settings)
        self._spawn(name_kubelet, kubeletconf.argv(bins.kubelet, node.kubelet_config, settings), env)

    def _start_driver(self, node: RealNode) -> None:
        kubeconfig = self.driver_credentials(node)
        self._spawn(node.processes[0], commands.driver_argv(node, kubeconfig), {**os.environ, **self.driver_env})

    def restart(self, node: RealNode, process: str = "driver", timeout: float = 90.0) -> float:
        """Stop the node's ``driver`` or ``kubelet`` (SIGTERM) and start it again with the same command line.

        Returns the seconds until kubelet has registered the driver anew. Running containers, the checkpoint,
        CDI specs, MPS daemons and the simulator's state stay, as they do when a DaemonSet pod or kubelet
        restarts on a node; kubelet finds the (new) registration socket by itself.
        """
        name = {"driver": node.processes[0], "kubelet": node.processes[1]}[process]
        record = procs.read_records(self.pid_dir)[name]
        driver_log = self.log(node.processes[0])
        before = readiness.registrations(driver_log)
        child = self._children.pop(name, None)
        procs.stop(record, child[0] if child else None)
        began = time.monotonic()
        bins = self.bins or binaries.ensure_node_binaries(out=self._out, k8s_module_dir=self.release.module_dir)
        env = {**os.environ, **self.driver_env} if process == "driver" else commands.process_env(bins)
        self._spawn(name, list(record.argv), env)
        while readiness.registrations(driver_log) <= before:
            self._alive(node.name)
            if time.monotonic() - began > timeout:
                raise procs.ComponentError(name, f"driver not registered again after {timeout:.0f}s", self.log(name))
            time.sleep(0.1)
        return time.monotonic() - began

    def upgrade_kubelet(self, node: RealNode, release: releases.Release) -> float:
        """Replace the node's running kubelet by ``release``'s, in place, as an operator upgrades a node.

        The kubelet is stopped (SIGTERM; containers, the runtime and the driver run on), its
        configuration gets the new release's feature gates, and the new build starts with the same
        command line otherwise. Returns the seconds until the Node reports the new version and is Ready.
        """
        bins = binaries.ensure_node_binaries(out=self._out, k8s_module_dir=release.module_dir)
        name = node.processes[1]
        record = procs.read_records(self.pid_dir)[name]
        child = self._children.pop(name, None)
        began = time.monotonic()
        procs.stop(record, child[0] if child else None)
        config = yaml.safe_load(node.kubelet_config.read_text())
        config["featureGates"] = dict(release.feature_gates)
        node.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=True))
        self._spawn(name, [str(bins.kubelet), *record.argv[1:]], commands.process_env(bins))
        self.release, self.bins, self.feature_gates = release, bins, dict(release.feature_gates)
        pins = build.read_pins(release.module_dir / "go.mod")

        def upgraded(node_name: str) -> str | None:
            with contextlib.closing(identity.new_client(self.access.admin_kubeconfig)) as api:
                version = readiness.kubelet_version(api, node_name)
                if version != pins.kubernetes:
                    return f"kubelet reports {version}, not {pins.kubernetes} yet"
                return readiness.node_problem(api, node_name)

        self._wait([node], began, upgraded, f"kubelet {pins.kubernetes} Ready", 1)
        return time.monotonic() - began

    def _alive(self, node_name: str) -> None:
        """Raise if a process this object started for the node has exited."""
        records = procs.read_records(self.pid_dir)
        for name in self.node(node_name).processes:
            if name not in self._children:
                continue
            record = records.get(name)
            if record is None or not procs.is_alive(record):
                raise procs.ComponentError(name, "exited during start-up", self.log(name))

    def _wait(
        self, planned: Sequence[RealNode], began: float, check: readiness.Check, what: str, process: int
    ) -> dict[str, float]:
        def timed_out(node_name: str, problem: str) -> BaseException:
            name = self.node(node_name).processes[process]
            return procs.ComponentError(name, problem, self.log(name))

        return dict(
            readiness.wait_all(
                [n.name for n in planned],
                check,
                what,
                began=began,
                timeout=self.ready_timeout,
                alive=self._alive,
                out=self._out,
                on_timeout=timed_out,
            )
        )

    def _ready(self, name: str) -> str | None:
        with contextlib.closing(identity.new_client(self.access.admin_kubeconfig)) as api:
            return readiness.node_problem(api, name)

    def _published(self, name: str) -> str | None:
        if not readiness.registered(self.log(self.node(name).processes[0])):
            return "driver not registered by kubelet yet"
        with contextlib.closing(identity.new_client(self.access.admin_kubeconfig)) as api:
            return readiness.pool_problem(api, name)

    def detach(self) -> None:
        """Let the processes outlive this object (``python -m e2e up``)."""
        self._children.clear()

    def stop(self, *, remove: bool = True) -> list[str]:
        """Take the nodes this object started off the machine (and, ``remove``, out of the API); return leftovers."""
        left: list[str] = []
        for node in reversed(self.started):
            left += teardown.teardown(node, self.pid_dir, self._out)
        for name, (proc, record) in list(self._children.items()):
            procs.stop(record, proc)
            del self._children[name]
        if remove and self.started:
            self._remove_from_api(self.started)
        started = {n.name for n in self.started}
        self.nodes = [n for n in self.nodes if n.name not in started]
        plan.save(self.state_dir, self.nodes)
        self.started.clear()
        return left

    def _remove_from_api(self, gone: Sequence[RealNode]) -> None:
        nodes.remove_from_api(self.access.admin_kubeconfig, [n.name for n in gone], self._out)
