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
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from e2e.cluster import flags, pki, procs
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


def _https_get(url: str, context: ssl.SSLContext, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")


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

    # Internals ---------------------------------------------------------------

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

        admin_ctx = ssl.create_default_context(cafile=str(cluster_pki.ca.cert))
        admin_ctx.load_cert_chain(str(cluster_pki.admin.cert), str(cluster_pki.admin.key))
        insecure_ctx = ssl.create_default_context()
        insecure_ctx.check_hostname = False
        insecure_ctx.verify_mode = ssl.CERT_NONE

        pki.write_kubeconfig(self.kubeconfig, self.server, cluster_pki.ca.cert, cluster_pki.admin, "gpuplane-admin")
        kcm_kubeconfig = pki.write_kubeconfig(
            self.state_dir / "kubeconfigs" / "kube-controller-manager.kubeconfig",
            self.server,
            cluster_pki.ca.cert,
            cluster_pki.controller_manager,
            "system:kube-controller-manager",
        )
        sched_kubeconfig = pki.write_kubeconfig(
            self.state_dir / "kubeconfigs" / "kube-scheduler.kubeconfig",
            self.server,
            cluster_pki.ca.cert,
            cluster_pki.scheduler,
            "system:kube-scheduler",
        )

        # etcd -------------------------------------------------------------------
        self._progress(started, f"starting etcd (client :{etcd_client}, peer :{etcd_peer})")
        client_url, peer_url = f"http://127.0.0.1:{etcd_client}", f"http://127.0.0.1:{etcd_peer}"
        self._spawn(
            "etcd",
            flags.etcd_argv(self.bins.etcd, self.state_dir / "etcd-data", client_url, peer_url),
        )

        def etcd_ready() -> tuple[bool, str]:
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=2) as resp:
                    body = resp.read().decode(errors="replace")
            except (OSError, urllib.error.URLError) as err:
                return False, str(err)
            try:
                return json.loads(body).get("health") == "true", body
            except ValueError:
                return False, body

        self._wait("etcd", started, etcd_ready)

        # kube-apiserver ----------------------------------------------------------
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

        def apiserver_ready() -> tuple[bool, str]:
            try:
                status, body = _https_get(f"{self.server}/readyz?verbose", admin_ctx)
            except OSError as err:
                return False, str(err)
            failing = [line for line in body.splitlines() if "failed" in line]
            return status == 200, f"HTTP {status}: " + ("; ".join(failing) or body[-300:])

        self._wait("kube-apiserver /readyz", started, apiserver_ready)

        # kube-controller-manager and kube-scheduler -------------------------------
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

        def healthz(port: int) -> Callable[[], tuple[bool, str]]:
            def check() -> tuple[bool, str]:
                try:
                    status, body = _https_get(f"https://127.0.0.1:{port}/healthz", insecure_ctx)
                except OSError as err:
                    return False, str(err)
                return status == 200, f"HTTP {status}: {body[-300:]}"

            return check

        self._wait("kube-controller-manager /healthz", started, healthz(kcm_port))
        self._wait("kube-scheduler /healthz", started, healthz(sched_port))

        def default_service_account() -> tuple[bool, str]:
            try:
                status, body = _https_get(f"{self.server}/api/v1/namespaces/default/serviceaccounts/default", admin_ctx)
            except OSError as err:
                return False, str(err)
            return status == 200, f"HTTP {status}: {body[-300:]}"

        self._wait("kube-controller-manager (default ServiceAccount)", started, default_service_account)
