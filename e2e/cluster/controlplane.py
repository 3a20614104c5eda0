"""A real Kubernetes control plane on loopback: etcd, apiserver, controller-manager, scheduler.

``ControlPlane(state_dir, bins)`` starts every component as its own process
group on free loopback ports, waits until each is ready, and writes an admin
kubeconfig to ``state_dir/kubeconfig``. ``stop()`` (or leaving the ``with``
block) stops them all; ``stop_state_dir(state_dir)`` does the same from
another process, using the pidfiles in ``state_dir/pids``.

The command line of each component (feature gates, API versions, certificates) is
:mod:`e2e.cluster.flags`'s; this module starts them in order and waits for each.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from e2e.cluster import flags, pki, procs, readyz
from e2e.cluster.build import BinPaths

Printer = Callable[[str], None]

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
PROGRESS_EVERY_S = 15.0


def free_port(taken: set[int]) -> int:
    """A loopback TCP port that is free now and not in ``taken``; it is added to ``taken``."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port


def running(state_dir: Path) -> dict[str, procs.ProcessRecord]:
    """Components of ``state_dir`` whose processes still run."""
    return {name: r for name, r in procs.read_records(state_dir / "pids").items() if procs.is_alive(r)}


def stop_state_dir(state_dir: Path, out: Printer = print) -> list[str]:
    """Stop every component recorded in ``state_dir/pids``; return the names stopped."""
    pid_dir = state_dir / "pids"
    records = procs.read_records(pid_dir)
    stopped = []
    for name in _stop_order(records):
        record = records[name]
        if procs.is_alive(record):
            out(f"stopping {name} (pid {record.pid})")
            procs.stop(record)
            stopped.append(name)
        procs.pidfile(pid_dir, name).unlink(missing_ok=True)
    return stopped


def _stop_order(names: Mapping[str, object]) -> list[str]:
    known = [n for n in reversed(COMPONENTS) if n in names]
    return [n for n in names if n not in known] + known


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback."""

    def __init__(
        self,
        state_dir: Path,
        bins: BinPaths,
        *,
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Mapping[str, bool] | None = None,
        ready_timeout: float = 180.0,
        verbosity: int = 2,
        die_with_parent: bool = False,
        client_qps: int | None = None,
        component_env: Mapping[str, Mapping[str, str]] | None = None,
        out: Printer = print,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        # Extra environment per component (e.g. {"kube-apiserver": {"GOMEMLIMIT": "12GiB"}}), over this one's.
        self.component_env = {k: dict(v) for k, v in (component_env or {}).items()}
        # Client-side rate limit of kube-scheduler and kube-controller-manager (their defaults:
        # 50/100 and 20/30 per controller); None keeps the upstream defaults.
        self.client_qps = client_qps
        self.bins = bins
        self.feature_gates: dict[str, bool] = dict(
            flags.DEFAULT_FEATURE_GATES if feature_gates is None else feature_gates
        )
        self.runtime_config: dict[str, bool] = dict(
            flags.DEFAULT_RUNTIME_CONFIG if runtime_config is None else runtime_config
        )
        self.ready_timeout = ready_timeout
        self.verbosity = verbosity
        self.die_with_parent = die_with_parent
        self._out = out
        self._children: dict[str, tuple[subprocess.Popen[bytes], procs.ProcessRecord]] = {}
        self.server: str | None = None
        self.pki: pki.ClusterPKI | None = None

    # Paths -----------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (group system:masters)."""
        return self.state_dir / "kubeconfig"

    @property
    def pki_dir(self) -> Path:
        """Where the CA and certificates live (``pki.mint_node_cert`` takes this)."""
        return self.state_dir / "pki"

    @property
    def log_dir(self) -> Path:
        """One ``<component>.log`` per component."""
        return self.state_dir / "logs"

    @property
    def pid_dir(self) -> Path:
        """One pidfile per component."""
        return self.state_dir / "pids"

    def log(self, component: str) -> Path:
        """The log file of ``component``."""
        return self.log_dir / f"{component}.log"

    # Lifecycle --------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> Path:
        """Start every component, wait until the cluster is usable; return the admin kubeconfig path."""
        alive = running(self.state_dir)
        if alive:
            raise RuntimeError(
                f"a control plane from {self.state_dir} is still running ({', '.join(sorted(alive))}); "
                f"stop it first (`python -m e2e down --state-dir {self.state_dir}`)"
            )
        missing = self.bins.missing()
        if missing:
            raise FileNotFoundError(
                "missing control-plane binaries: " + ", ".join(map(str, missing)) + " (run `python -m e2e build`)"
            )
        started = time.monotonic()
        try:
            self._start(started)
        except BaseException:
            self.stop()
            raise
        self._out(f"control plane ready in {time.monotonic() - started:.1f}s; logs in {self.log_dir}")
        return self.kubeconfig

    def stop(self) -> None:
        """Stop every component this object started (and any left in its pidfiles)."""
        for name in _stop_order(self._children):
            proc, record = self._children.pop(name)
            procs.stop(record, proc)
            procs.pidfile(self.pid_dir, name).unlink(missing_ok=True)
        stop_state_dir(self.state_dir, out=self._out)

    def detach(self) -> None:
        """Forget the started processes so that they outlive this object (for ``up``)."""
        self._children.clear()

    def upgrade(
        self, bins: BinPaths, *, feature_gates: Mapping[str, bool], runtime_config: Mapping[str, bool]
    ) -> dict[str, float]:
        """Replace each running component by ``bins``' build, one at a time, as an in-place cluster upgrade does.

        In kubeadm's order (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), each is stopped
        and started again on the same data, certificates and ports with the new binary and the new
        release's feature gates and API versions, and waited for before the next. Returns component ->
        seconds from its stop until it was ready again (for the apiserver: its outage).
        """
        records = procs.read_records(self.pid_dir)
        replaced = {
            "--feature-gates": flags.format_gates(feature_gates),
            "--runtime-config": flags.format_gates(runtime_config),
        }
        outage: dict[str, float] = {}
        began = time.monotonic()
        for name in COMPONENTS:
            record = records[name]
            argv = [str(bins.by_name()[name])]
            for arg in record.argv[1:]:
                flag = arg.split("=", 1)[0]
                argv.append(f"{flag}={replaced[flag]}" if flag in replaced else arg)
            child = self._children.pop(name, None)
            stopped = time.monotonic()
            procs.stop(record, child[0] if child else None)
            self._spawn(name, argv)
            self._wait(f"{name} ({Path(argv[0]).parent.name})", began, self._ready_check(name))
            outage[name] = time.monotonic() - stopped
        self.bins = bins
        self.feature_gates, self.runtime_config = dict(feature_gates), dict(runtime_config)
        return outage

    # Internals ---------------------------------------------------------------

    def _admin_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        ctx.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        return ctx

    def _ready_check(self, name: str) -> readyz.Check:
        """Whether the running ``name`` serves (:func:`e2e.cluster.readyz.check`)."""
        return readyz.check(name, procs.read_records(self.pid_dir)[name].argv, self._admin_context())

    def _progress(self, started: float, message: str) -> None:
        self._out(f"[{time.monotonic() - started:5.1f}s] {message}")

    def _reset_state_dir(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("pki", "etcd-data", "logs", "pids", "certs", "kubeconfigs"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        self.kubeconfig.unlink(missing_ok=True)

    def _spawn(self, name: str, argv: list[str]) -> None:
        proc, record = procs.spawn(
            name,
            argv,
            log=self.log(name),
            pid_dir=self.pid_dir,
            env=os.environ | self.component_env[name] if name in self.component_env else None,
            cwd=self.state_dir,
            die_with_parent=self.die_with_parent,
        )
        self._children[name] = (proc, record)

    def _check_alive(self) -> None:
        for name, (proc, record) in self._children.items():
            code = proc.poll()
            if code is not None:
                raise procs.ComponentError(name, f"exited with code {code} during start-up", record.log)

    def _wait(self, name: str, started: float, check: Callable[[], tuple[bool, str]]) -> None:
        self._progress(started, f"waiting for {name} ...")
        begin = time.monotonic()
        last_note = begin
        detail = ""
        while True:
            self._check_alive()
            ok, detail = check()
            if ok:
                self._progress(started, f"{name} ready ({time.monotonic() - begin:.1f}s)")
                return
            now = time.monotonic()
            if now - begin > self.ready_timeout:
                component = name.split(maxsplit=1)[0]
                log = self.log(component if component in COMPONENTS else "kube-apiserver")
                raise procs.ComponentError(
                    component, f"not ready after {self.ready_timeout:.0f}s (last check: {detail[:2000]})", log
                )
            if now - last_note > PROGRESS_EVERY_S:
                last_note = now
                self._progress(started, f"  still waiting for {name} ({now - begin:.0f}s)")
            time.sleep(0.25)

    def _start(self, started: float) -> None:
        self._reset_state_dir()
        self._progress(started, "generating certificates")
        cluster_pki = pki.generate_cluster_pki(self.pki_dir)
        self.pki = cluster_pki
        ports: set[int] = set()
        etcd_client, etcd_peer = free_port(ports), free_port(ports)
        api_port, kcm_port, sched_port = free_port(ports), free_port(ports), free_port(ports)
        self.server = f"https://127.0.0.1:{api_port}"
        gates = flags.format_gates(self.feature_gates)

        pki.write_kubeconfig(self.kubeconfig, self.server, cluster_pki.ca.cert, cluster_pki.admin, "gpuplane-admin")
        kcm_kubeconfig, sched_kubeconfig = (
            pki.write_kubeconfig(
                self.state_dir / "kubeconfigs" / f"{name}.kubeconfig",
                self.server,
                cluster_pki.ca.cert,
                cert,
                f"system:{name}",
            )
            for name, cert in (
                ("kube-controller-manager", cluster_pki.controller_manager),
                ("kube-scheduler", cluster_pki.scheduler),
            )
        )

        # etcd, then kube-apiserver, then kube-controller-manager and kube-scheduler together ------------
        client_url, peer_url = f"http://127.0.0.1:{etcd_client}", f"http://127.0.0.1:{etcd_peer}"
        self._progress(started, f"starting etcd (client :{etcd_client}, peer :{etcd_peer})")
        self._spawn("etcd", flags.etcd_argv(self.bins.etcd, self.state_dir / "etcd-data", client_url, peer_url))
        self._wait("etcd", started, self._ready_check("etcd"))

        self._progress(started, f"starting kube-apiserver on {self.server}")
        flags.admission_config_path(self.state_dir).write_text(json.dumps(flags.admission_config()))
        self._spawn(
            "kube-apiserver",
            flags.apiserver_argv(
                self.bins.kube_apiserver,
                self.state_dir,
                port=api_port,
                client_url=client_url,
                cluster_pki=cluster_pki,
                runtime_config=self.runtime_config,
                gates=gates,
                verbosity=self.verbosity,
            ),
        )
        self._wait("kube-apiserver /readyz", started, self._ready_check("kube-apiserver"))

        self._progress(started, "starting kube-controller-manager and kube-scheduler")
        self._spawn(
            "kube-controller-manager",
            flags.controller_manager_argv(
                self.bins.kube_controller_manager,
                self.state_dir,
                port=kcm_port,
                kubeconfig=kcm_kubeconfig,
                cluster_pki=cluster_pki,
                gates=gates,
                verbosity=self.verbosity,
                client_qps=self.client_qps,
            ),
        )
        self._spawn(
            "kube-scheduler",
            flags.scheduler_argv(
                self.bins.kube_scheduler,
                self.state_dir,
                port=sched_port,
                kubeconfig=sched_kubeconfig,
                gates=gates,
                verbosity=self.verbosity,
                client_qps=self.client_qps,
            ),
        )
        self._wait("kube-controller-manager /healthz", started, self._ready_check("kube-controller-manager"))
        self._wait("kube-scheduler /healthz", started, self._ready_check("kube-scheduler"))
        admin_ctx = self._admin_context()

        def default_service_account() -> tuple[bool, str]:
            try:
                status, body = readyz.https_get(
                    f"{self.server}/api/v1/namespaces/default/serviceaccounts/default", admin_ctx
                )
            except OSError as err:
                return False, str(err)
            return status == 200, f"HTTP {status}: {body[-300:]}"

        self._wait("kube-controller-manager (default ServiceAccount)", started, default_service_account)
