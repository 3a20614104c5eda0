"""This node's IMEX daemon, run and reported (``--imex-daemons=process``): the I/O around :mod:`.imex_daemons`.

Every tick (1 s) :meth:`ImexDaemons.tick` lists the ``ImexDomain`` objects (strict parser; a refused one is
ignored whole), asks :func:`.imex_daemons.wanted` which daemon should run here and
:func:`.imex_daemons.next_step` what to do, and does it, in ``<plugin dir>/imex/``:

- **start**: writes ``config.cfg`` (``BIND_INTERFACE_IP`` = this node's address, the command service on
  ``cmd.sock``), ``nodes.cfg`` (the domain's nodes' addresses in node-name order) and ``daemon.json`` (the
  domain, pid), and runs ``<imex binary> -c config.cfg`` as the driver's child, in its process group (it is
  stopped when the driver stops: a process-mode daemon does not outlive its driver; one a killed driver left
  is stopped by the next driver at its start);
- **reload**: rewrites ``nodes.cfg`` and sends the daemon ``SIGUSR1`` (it re-reads the node file);
- **restart** (another domain, another address: the config is read only at start) and **stop**: SIGTERM
  (SIGKILL after 5 s) and the directory removed;
- a daemon that **exited** is started again after 1, 2, 4 ... 60 s (:func:`.imex_daemons.restart_delay`);
  each exit is logged with what to do, counted (``on_exit``: the driver's ``gpuplane_driver_imex_daemon_exits``)
  and reported in the status message until the daemon is ready again (the controller tells the domain's gangs).

Then it reports: ``<imex ctl binary> -q --u=<plugin dir>/imex/cmd.sock`` printing ``READY`` is ready, and
this node's entry of the domain's ``status.nodes`` is patched (ready, message, ``observedGeneration`` = the
generation whose node file the daemon has) when it differs from what the object holds; a domain listing
this node that gets no daemon (two domains, a missing address) gets ``ready: false`` and why. The patch is
a merge patch of ``status.nodes`` with the object's ``resourceVersion`` (another node's driver writing its
own entry at the same time makes it 409, and it is read and merged again); the admission policy
``gpuplane-driver-own-imex-status`` lets a driver change only its own node's entry.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import structlog
from kubernetes import client

from gpuplane.api import imex, kuberesponse
from gpuplane.driver.host import atomic_write
from gpuplane.driver.sharing import imex_daemons as decide

log = structlog.get_logger(__name__)

TICK_S = 1.0
STOP_TIMEOUT_S = 5.0
QUERY_TIMEOUT_S = 5.0
SETTLE_S = 1.0  # after a start or a reload, the daemon's answers may still be about the old node file


def parse_all(objects: Sequence[Any], seen: set[tuple[str, int]] | None = None) -> list[imex.ImexDomain]:
    """The objects the strict parser accepts; each refused one logged (once per name and generation when ``seen``).

    The one reader of listed ``ImexDomain`` objects: this runner's tick and prepare's gate
    (:mod:`gpuplane.driver.prepare.imex_claims`)."""
    out: list[imex.ImexDomain] = []
    for obj in objects:
        domain, why = imex.parse_domain(obj)
        if domain is not None:
            out.append(domain)
            continue
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        generation = meta.get("generation")
        key = (str(meta.get("name"))[:64], generation if isinstance(generation, int) else -1)
        if seen is None or key not in seen:
            log.warning("ImexDomain refused and ignored", why=why)
            if seen is not None:
                seen.add(key)
    return out


class StatusApi:
    """Reads one ImexDomain and merge-patches its ``status.nodes`` (the driver's Role ``gpuplane-driver-imex``)."""

    def __init__(self, api_client: client.ApiClient, namespace: str = imex.NAMESPACE) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            raw = self.custom.get_namespaced_custom_object(
                imex.GROUP, imex.VERSION, self.namespace, imex.PLURAL, name, _preload_content=False
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        obj = kuberesponse.read_object(raw)
        return obj if isinstance(obj, dict) else None

    def patch_nodes(self, name: str, nodes: list[Any], resource_version: str) -> bool:
        """Set ``status.nodes``; False on a conflict (the object changed since it was read) or when it is gone."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": {"nodes": nodes}}
        try:
            self.custom.patch_namespaced_custom_object_status(
                imex.GROUP,
                imex.VERSION,
                self.namespace,
                imex.PLURAL,
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        except client.ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True


def report(api: StatusApi, obj: Mapping[str, Any] | None, name: str, entry: Mapping[str, Any]) -> bool:
    """Make this node's entry of ``name``'s status ``entry`` (``obj``: the object as last listed); True if written."""
    for _ in range(5):
        if obj is None:
            obj = api.get(name)
            if obj is None:
                return False
        nodes = decide.merged_status((obj.get("status") or {}).get("nodes"), entry)
        if nodes is None:
            return False
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if api.patch_nodes(name, nodes, version):
            return True
        obj = None  # changed under us: read it again
    log.warning("ImexDomain status kept changing; retrying on the next tick", domain=name)
    return False


class ImexDaemons:
    """This node's IMEX daemon as the driver's child, and its readiness in the domains' status."""

    def __init__(
        self,
        node: str,
        directory: Path,
        list_domains: Callable[[], Sequence[Any]],
        status: StatusApi,
        *,
        binary: str,
        ctl_binary: str,
        port: int = decide.PEER_PORT,
        clock: Callable[[], float] = time.monotonic,
        on_exit: Callable[[int], None] = lambda code: None,
    ) -> None:
        self.node, self.dir = node, directory
        self.list_domains, self.status = list_domains, status
        self.binary, self.ctl_binary, self.port = binary, ctl_binary, port
        self.clock, self.on_exit = clock, on_exit  # on_exit(code): each exit seen (the driver's metric)
        self._proc: subprocess.Popen[bytes] | None = None
        self._running: decide.Running | None = None
        self._generation = 0  # the generation whose node file the daemon has
        self._exits = 0  # in a row, since it was last ready
        self._restart_at = 0.0
        self._exit_note = ""  # the last exit, as the status message says it
        self._settle_until = 0.0
        self._seen_refused: set[tuple[str, int]] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ files and the process

    @property
    def log_file(self) -> Path:
        return self.dir.parent / "imex-daemon.log"  # outside the directory: it survives a restart

    def _write_files(self, want: decide.DaemonWant) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        here = PurePosixPath(self.dir)
        atomic_write(self.dir / decide.CONFIG, decide.config_text(here, want.bind_ip, self.port).encode(), 0o644)
        atomic_write(self.dir / decide.NODES, decide.node_file_text(want.node_ips).encode(), 0o644)

    def _record(self, want: decide.DaemonWant, pid: int) -> None:
        record = {"domain": want.domain, "generation": want.generation, "pid": pid, "bind_ip": want.bind_ip}
        atomic_write(self.dir / decide.RECORD, json.dumps(record, sort_keys=True).encode(), 0o644)

    def _start(self, want: decide.DaemonWant) -> None:
        self._write_files(want)
        with open(self.log_file, "ab") as out:
            self._proc = subprocess.Popen(
                [self.binary, "-c", str(self.dir / decide.CONFIG)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                # In the driver's process group: a signal to the group (a supervisor stopping the driver) stops
                # it too; a driver killed alone leaves it, and the next driver stops it (_clear_leftovers).
            )
        self._record(want, self._proc.pid)
        self._running = decide.Running(want.domain, want.bind_ip, want.node_ips, alive=True)
        self._generation = want.generation
        self._settle_until = self.clock() + SETTLE_S
        log.info("imex daemon started", domain=want.domain, pid=self._proc.pid, nodes=list(want.node_ips))

    def _reload(self, want: decide.DaemonWant) -> None:
        atomic_write(self.dir / decide.NODES, decide.node_file_text(want.node_ips).encode(), 0o644)
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGUSR1)
        self._record(want, self._proc.pid if self._proc else 0)
        self._running = decide.Running(want.domain, want.bind_ip, want.node_ips, alive=True)
        self._generation = want.generation
        self._settle_until = self.clock() + SETTLE_S
        log.info("imex daemon node file rewritten, SIGUSR1 sent", domain=want.domain, nodes=list(want.node_ips))

    def _stop_daemon(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        if self._running is not None:
            log.info("imex daemon stopped and its files removed", domain=self._running.domain)
        self._running = None
        self._exits, self._exit_note = 0, ""

    def _observe(self, now: float) -> decide.Running | None:
        """What runs now; a daemon found dead is noted once (counted, logged, its restart delayed)."""
        running = self._running
        if running is None or not running.alive or self._proc is None:
            return running
        code = self._proc.poll()
        if code is None:
            return running
        self._exits += 1
        self.on_exit(code)
        delay = decide.restart_delay(self._exits)
        self._restart_at = now + delay
        self._exit_note = (
            f"nvidia-imex exited with code {code} ({self._exits} exit(s) in a row); restarted in {delay:g}s; "
            f"see {self.log_file} on node {self.node}"
        )
        log.warning(
            "imex daemon exited; restarting with backoff",
            domain=running.domain,
            code=code,
            exits=self._exits,
            restart_in_s=delay,
            log=str(self.log_file),
            what_to_do="read the daemon's log; a daemon that keeps exiting leaves its domain not ready",
        )
        self._running = decide.Running(running.domain, running.bind_ip, running.node_ips, alive=False)
        return self._running

    def query(self) -> tuple[bool, str]:
        """(ready, what ``nvidia-imex-ctl -q`` said or why it could not be asked)."""
        try:
            done = subprocess.run(
                [self.ctl_binary, "-q", f"--u={self.dir / decide.SOCKET}"],
                capture_output=True,
                text=True,
                timeout=QUERY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"nvidia-imex-ctl -q failed: {exc}"
        if decide.is_ready(done.stdout):
            return True, ""
        said = (done.stdout.strip() or done.stderr.strip() or f"exit {done.returncode}").splitlines()[-1][:300]
        return False, f"nvidia-imex-ctl -q says {said} (waiting for the domain's peers)"

    # ------------------------------------------------------------------ the tick

    def tick(self) -> None:
        now = self.clock()
        listed = list(self.list_domains())
        by_name = {str((o.get("metadata") or {}).get("name")): o for o in listed if isinstance(o, dict)}
        domains = parse_all(listed, self._seen_refused)
        plan = decide.wanted(domains, self.node)
        want = plan.daemon
        step = decide.next_step(want, self._observe(now))
        if step == "start" and self._running is not None and now < self._restart_at:
            step = "keep"  # a daemon that exited waits its backoff
        if step == "reload" and now < self._settle_until:
            step = "keep"  # a daemon just started may not handle SIGUSR1 yet (its default action ends it)
        if step in ("stop", "restart"):
            self._stop_daemon()
        if want is not None and step in ("start", "restart"):
            self._start(want)
        elif want is not None and step == "reload":
            self._reload(want)
        elif want is not None and self._running is not None and want.generation != self._generation:
            self._generation = want.generation  # the spec changed but not its addresses: same daemon serves it
        for name, why in plan.refused.items():
            domain = next(d for d in domains if d.name == name)
            report(self.status, by_name.get(name), name, decide.status_entry(self.node, False, why, domain.generation))
        if want is None or self._running is None or now < self._settle_until:
            return
        if not self._running.alive:
            ready, message = False, self._exit_note
        else:
            ready, message = self.query()
            if ready:
                self._exits, self._exit_note = 0, ""
            elif self._exit_note:
                message = f"{message}; earlier: {self._exit_note}"
        entry = decide.status_entry(self.node, ready, message, self._generation)
        report(self.status, by_name.get(want.domain), want.domain, entry)

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        self._clear_leftovers()
        self._thread = threading.Thread(target=self._loop, name="imex-daemons", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
            except Exception:  # the API or the disk: the next tick tries again
                log.exception("imex daemon tick failed; retrying")

    def stop(self) -> None:
        """Stop the loop and the daemon (a process-mode daemon does not outlive its driver)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=QUERY_TIMEOUT_S + STOP_TIMEOUT_S)
        self._stop_daemon()

    def _clear_leftovers(self) -> None:
        """A daemon a previous driver left (killed without its SIGTERM reaching the child): stopped, files gone."""
        try:
            record = json.loads((self.dir / decide.RECORD).read_bytes())
        except (OSError, ValueError):
            record = None
        pid = record.get("pid") if isinstance(record, dict) else None
        if isinstance(pid, int) and pid > 0:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                cmdline = b""
            if str(self.dir / decide.CONFIG).encode() in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                log.info("stopped the imex daemon a previous driver left", pid=pid)
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
