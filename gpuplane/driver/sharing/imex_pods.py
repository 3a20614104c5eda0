"""This node's IMEX daemon in a pod of its own (``--imex-daemons=pod``), so it outlives driver restarts.

A daemon run as the driver's child (:mod:`.imex_runner`, ``--imex-daemons=process``) dies with the driver's
container: every rollout or restart of the driver pod would take the node out of its IMEX domain, and every
gang on it would lose its cross-tray memory. Here the driver creates, on its own node, one pod per
``ImexDomain`` listing the node, as it does for MPS daemons (:mod:`.mps_pods`: the same template read from the
driver's own pod, the same pod skeleton, the same admission policy ``gpuplane-driver-own-node-pods``, whose IMEX
branch admits exactly this shape):

- :func:`daemon_pod` (pure): the driver's image running :mod:`.imex_watch` around ``<imex binary> -c
  <dir>/config.cfg``, the host's network (the daemon binds the node's InternalIP and its peers connect to it),
  ``<plugin dir>/imex`` (config, node file, command socket, record) mounted at the path the driver sees it, so
  the driver's ``nvidia-imex-ctl -q --u=<dir>/cmd.sock`` reaches the daemon; ``restartPolicy: Always`` (kubelet
  restarts a daemon that exits, as NVIDIA's daemon pods do);
- :class:`ImexPodDaemons`: :class:`.imex_runner.ImexDaemons` with the pod in place of the child process: a start
  writes the files and creates the pod; a reload only rewrites the node file (the watcher in the pod sends the
  daemon ``SIGUSR1``); a stop deletes the pod (and waits) and removes the files; the driver's own stop leaves
  the pod running; at start-up the driver **adopts** the pod its predecessor left (named in ``daemon.json``,
  still serving) instead of replacing it, and deletes any other IMEX pod of its node.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from gpuplane.driver.host import atomic_write
from gpuplane.driver.sharing import imex_daemons as decide
from gpuplane.driver.sharing.imex_runner import ImexDaemons
from gpuplane.driver.sharing.mps_pods import (
    NODE_LABEL,
    PodApi,
    PodTemplate,
    api_reason,
    delete_and_wait,
    pod_failure,
    pod_skeleton,
)
from gpuplane.driver.sharing.mps_spec import MpsError

log = structlog.get_logger(__name__)

APP_NAME = "gpuplane-imex-daemon"
COMPONENT = "imex-daemon"
DOMAIN_ANNOTATION = "gpuplane.dev/imex-domain"
CONTAINER = "imex-daemon"
WATCH_MODULE = "gpuplane.driver.sharing.imex_watch"
DELETE_TIMEOUT_S = 30.0


def pod_name(node: str, domain: str) -> str:
    """``gpuplane-imex-<hash of node and domain>``: one pod per node and domain, a valid name for any names."""
    return "gpuplane-imex-" + hashlib.sha256(f"{node}\0{domain}".encode()).hexdigest()[:20]


def selector(node: str) -> str:
    """The label selector of this node's IMEX daemon pods."""
    return f"app.kubernetes.io/component={COMPONENT},{NODE_LABEL}={node}"


def daemon_pod(template: PodTemplate, directory: Path, domain: str, binary: str) -> dict[str, Any]:
    """The pod that runs this node's daemon for ``domain`` from the files in ``directory`` (pure)."""
    host_dir = template.mount.host_of(directory)
    if host_dir is None:
        raise MpsError(f"the IMEX directory {directory} is outside the driver's hostPath {template.mount}")
    here = PurePosixPath(directory)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": template.image,
        "imagePullPolicy": template.image_pull_policy,
        "command": [
            "python3",
            "-m",
            WATCH_MODULE,
            f"--nodes={here / decide.NODES}",
            "--",
            binary,
            "-c",
            str(here / decide.CONFIG),
        ],
        "workingDir": "/",
        "env": [{"name": k, "value": v} for k, v in sorted(dict(template.env).items())],
        "volumeMounts": [{"name": "imex", "mountPath": str(here)}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": {"privileged": template.privileged},
    }
    labels = {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/component": COMPONENT}
    volumes = [{"name": "imex", "hostPath": {"path": str(host_dir), "type": "Directory"}}]
    body = pod_skeleton(template, pod_name(template.node_name, domain), labels, container, volumes)
    body["metadata"]["annotations"] = {DOMAIN_ANNOTATION: domain}
    body["spec"]["restartPolicy"] = "Always"
    return body


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """Why the daemon pod will not serve (:func:`.mps_pods.pod_failure`), except a container that exited: with
    ``restartPolicy: Always`` kubelet starts it again (its restarts are reported by :func:`restarts_note`)."""
    status = dict(pod.get("status") or {})
    status["containerStatuses"] = [
        cs for cs in status.get("containerStatuses") or [] if "terminated" not in (cs.get("state") or {})
    ]
    return pod_failure({**pod, "status": status})


def restarts_note(pod: Mapping[str, Any]) -> str:
    """How often kubelet restarted the daemon and how it last ended ('' when never)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        count = int(cs.get("restartCount") or 0)
        if count <= 0:
            return ""
        last = ((cs.get("lastState") or {}).get("terminated")) or {}
        waiting = ((cs.get("state") or {}).get("waiting") or {}).get("reason") or ""
        return (
            f"nvidia-imex restarted {count} time(s) by kubelet; it last exited with code {last.get('exitCode')} "
            f"({last.get('reason') or 'no reason'})" + (f", now {waiting}" if waiting else "")
        )
    return ""


class ImexPodDaemons(ImexDaemons):
    """:class:`ImexDaemons` with the daemon in a pod of its own on this node (see the module docstring)."""

    def __init__(self, *args: Any, pods: PodApi, template: PodTemplate, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pods, self.template = pods, template
        self._pod = ""

    def _record_pod(self, want: decide.DaemonWant) -> None:
        record = {"domain": want.domain, "generation": want.generation, "pod": self._pod, "bind_ip": want.bind_ip}
        atomic_write(self.dir / decide.RECORD, json.dumps(record, sort_keys=True).encode(), 0o644)

    def _start(self, want: decide.DaemonWant) -> None:
        self._write_files(want)
        body = daemon_pod(self.template, self.dir, want.domain, self.binary)
        name, ns = body["metadata"]["name"], self.template.namespace
        if self.pods.get_pod(ns, name) is not None:  # left ending (a crash loop, a deletion): a fresh one
            delete_and_wait(self.pods, ns, name, DELETE_TIMEOUT_S)
        self._pod = name
        self._running = decide.Running(want.domain, want.bind_ip, want.node_ips, alive=True)
        self._generation = want.generation
        self._settle_until = self.clock() + 1.0
        try:
            self.pods.create_pod(ns, body)
        except Exception as err:  # the API's refusal (the admission policy, a quota) is what the status says
            self._dead(f"cannot create IMEX daemon pod {ns}/{name}: {api_reason(err)}")
            return
        self._record_pod(want)
        log.info("imex daemon pod created", domain=want.domain, pod=name, nodes=list(want.node_ips))

    def _reload(self, want: decide.DaemonWant) -> None:
        atomic_write(self.dir / decide.NODES, decide.node_file_text(want.node_ips).encode(), 0o644)  # watched
        self._running = decide.Running(want.domain, want.bind_ip, want.node_ips, alive=True)
        self._generation = want.generation
        self._settle_until = self.clock() + 1.0
        self._record_pod(want)
        log.info("imex node file rewritten; the pod's watcher sends SIGUSR1", pod=self._pod, nodes=list(want.node_ips))

    def _dead(self, why: str) -> None:
        """The pod will not serve: counted as an exit, reported, started again after the backoff."""
        self._exits += 1
        delay = decide.restart_delay(self._exits)
        self._restart_at = self.clock() + delay
        self._exit_note = f"{why}; trying again in {delay:g}s"
        self._settle_until = 0.0  # reported on this tick
        log.warning("imex daemon pod not serving", pod=self._pod, why=why, retry_in_s=delay)
        running = self._running
        if running is not None:
            self._running = decide.Running(running.domain, running.bind_ip, running.node_ips, alive=False)

    def _stop_daemon(self) -> None:
        ns = self.template.namespace
        for pod in self.pods.list_pods(ns, selector(self.template.node_name)):
            name = str((pod.get("metadata") or {}).get("name"))
            if (pod.get("spec") or {}).get("nodeName") == self.template.node_name:
                if delete_and_wait(self.pods, ns, name, DELETE_TIMEOUT_S):
                    log.info("imex daemon pod deleted", pod=name)
                else:
                    log.warning("imex daemon pod still there after its deletion", pod=name)
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        self._running, self._pod = None, ""
        self._exits, self._exit_note = 0, ""

    def _observe(self, now: float) -> decide.Running | None:
        running = self._running
        if running is None or not running.alive or not self._pod:
            return running
        pod = self.pods.get_pod(self.template.namespace, self._pod)
        why = "the pod is gone" if pod is None else pod_problem(pod)
        if why is not None:
            self._dead(f"IMEX daemon pod {self.template.namespace}/{self._pod}: {why}")
            return self._running
        note = restarts_note(pod or {})
        if note:
            self._exit_note = note
        return running

    def stop(self) -> None:
        """Stop the loop only: the daemon's pod outlives this driver (the next one adopts it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def _clear_leftovers(self) -> None:
        """Adopt the pod a previous driver left when its record names it and it still serves; delete the rest.

        The API failing here is not fatal: the files stay, and the first tick starts the daemon, replacing a pod
        of the same name (a restart of the daemon, not a wedged driver)."""
        try:
            self._adopt_or_clear()
        except Exception:  # the API: logged, the loop goes on
            log.exception("could not look for the IMEX daemon pod of the previous driver; the first tick replaces it")

    def _adopt_or_clear(self) -> None:
        ns, node = self.template.namespace, self.template.node_name
        record: Any = None
        with contextlib.suppress(OSError, ValueError):
            record = json.loads((self.dir / decide.RECORD).read_bytes())
        record = record if isinstance(record, dict) else {}
        nodes: tuple[str, ...] = ()
        with contextlib.suppress(OSError):
            nodes = decide.parse_node_file((self.dir / decide.NODES).read_text())
        keep = ""
        name, domain = record.get("pod"), record.get("domain")
        if isinstance(name, str) and isinstance(domain, str) and name == pod_name(node, domain) and nodes:
            pod = self.pods.get_pod(ns, name)
            if pod is not None and pod_problem(pod) is None:
                keep = name
                self._pod = name
                self._running = decide.Running(domain, str(record.get("bind_ip") or ""), nodes, alive=True)
                generation = record.get("generation")
                self._generation = generation if isinstance(generation, int) else 0
                log.info("imex daemon pod adopted from the previous driver", pod=name, domain=domain)
        for pod in self.pods.list_pods(ns, selector(node)):
            other = str((pod.get("metadata") or {}).get("name"))
            if other != keep and (pod.get("spec") or {}).get("nodeName") == node:
                delete_and_wait(self.pods, ns, other, DELETE_TIMEOUT_S)
                log.info("deleted an IMEX daemon pod no record names", pod=other)
        if not keep and self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
