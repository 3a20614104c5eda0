"""Kubelet stand-in: what kubelet does for DRA on one node, and nothing else.

    python -m e2e.plane.kubelet --node-name N --kubeconfig NODE_KUBECONFIG \\
        --registry-dir DIR --cdi-root DIR [--label K=V ...] [--host-ip 127.0.0.2] [--status-file F]

* **Plugins**: watches ``--registry-dir`` for ``*-reg.sock`` and registers each
  plugin the way kubelet's plugin manager does (GetInfo, version choice, the dra-health
  stream, NotifyRegistrationStatus) through ``KubeletPluginClient.discover``; a socket that
  is replaced (driver restart) is registered again.
* **Node**: owns the node heartbeat (``e2e.plane.nodes.NodeHeartbeat``): the Node is
  created with ``--label``s and stays Ready while this process lives.
* **Pods** bound to the node (watch with ``spec.nodeName=N``): for each claim of
  a new pod, the claim name (``resourceClaimName``, or for a template the name
  kube-controller-manager wrote to ``status.resourceClaimStatuses``); wait until
  the claim is allocated and reserved for the pod; ``NodePrepareResources`` for
  the claims with devices of a registered driver not prepared on the node yet
  (kubelet's claim info cache); every returned CDI id must resolve to a spec
  file under ``--cdi-root`` (what the container runtime would do); then the pod
  is marked Running through ``pods/status``. A failed prepare becomes a Warning
  Event ``FailedPrepareDynamicResources``, retried with backoff; no claims: Running at once.
* **Deletion**: a pod with a ``deletionTimestamp`` gets ``NodeUnprepareResources``
  for claims no other pod on the node still uses, then the final delete with
  ``gracePeriodSeconds=0`` and a UID precondition, as kubelet does.

The parts: :mod:`~e2e.plane.kubelet_plugins` (registration), :mod:`~e2e.plane.kubelet_dra` (a
pod's claims, prepare/unprepare, the CDI check), :mod:`~e2e.plane.kubelet_pods` (what is read and
written about pods); this module watches the pods and drives one thread per pod.

It authenticates as the node (``system:node:<name>`` in ``system:nodes``), so
the Node authorizer and NodeRestriction constrain it exactly as they would a
kubelet: it can read only claims of pods bound to it and write only the
status of those pods.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from e2e.plane import nodes
from e2e.plane.kubelet_dra import BACKOFF_INITIAL_S, Claim, PodDra, PodNotReady, PrepareFailed
from e2e.plane.kubelet_plugins import PluginRegistry
from e2e.plane.kubelet_pods import PodEvents, PodView, delete_terminated, now, running_status, stamp, watch_pods

_log = logging.getLogger("e2e.plane.kubelet")

REASON_FAILED_PREPARE = "FailedPrepareDynamicResources"
BACKOFF_MAX_S = 30.0
CLAIM_POLL_S = 0.2
CLAIM_POLL_INITIAL_S = 0.01
"""First retry after a pod was not ready to start, doubling up to ``CLAIM_POLL_S``. Short because the common
cause right after the bind is a 403 on the claim read while the Node authorizer's graph catches up with
the binding (milliseconds); a fixed 200 ms poll cost half the claim pods 200 ms (bench/dra/dra_overhead.py --stages)."""
PLUGIN_POLL_S = 0.25


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the stand-in is told on its command line."""

    node_name: str
    registry_dir: Path
    cdi_root: Path
    host_ip: str = "127.0.0.1"
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_capacity: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Capacity added to the Node's (``nvidia.com/gpu: 8``: what a device plugin would make kubelet report)."""
    status_file: Path | None = None
    heartbeat_interval: float = 10.0
    workers_backoff_max: float = BACKOFF_MAX_S


@dataclasses.dataclass
class _PodSlot:
    """The latest view of one pod, and the thread that drives it."""

    pod: PodView
    wake: threading.Event
    thread: threading.Thread | None = None
    gone: bool = False
    seen: float = dataclasses.field(default_factory=time.monotonic)
    """When the pod watch first delivered the pod (bound to this node), monotonic."""
    tries: int = 0
    """Start attempts so far (each one that finds a claim not ready yet is another)."""
    first_wait: str = ""
    """Why the first attempt found the pod not ready to start ("" if it was)."""


class KubeletStandIn:
    """The stand-in itself; ``run(stop)`` blocks until ``stop`` is set."""

    def __init__(self, settings: Settings, api: client.ApiClient) -> None:
        self.settings = settings
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._lock = threading.Lock()
        self._pods: dict[str, _PodSlot] = {}
        self._claim_users: dict[str, set[str]] = {}  # claim uid -> uids of pods on this node using it
        self._prepared: dict[str, list[Claim]] = {}  # pod uid -> claims (maybe) prepared for it
        self._stop = threading.Event()
        self.plugins = PluginRegistry(settings.registry_dir, self._wake_all)
        self.dra = PodDra(self.custom, self.plugins, settings.node_name, settings.cdi_root)
        self.events = PodEvents(self.core, settings.node_name)
        self.heartbeat = nodes.NodeHeartbeat(
            settings.node_name,
            api,
            interval=settings.heartbeat_interval,
            labels=settings.labels,
            capacity={**nodes.DEFAULT_CAPACITY, **settings.extra_capacity},
            internal_ip=settings.host_ip,
        )

    # Lifecycle ---------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Start the heartbeat, plugin watcher and pod watch; return after ``stop`` is set."""
        self._stop = stop
        self.heartbeat.start()
        self.heartbeat.wait_schedulable(timeout=120)
        self.plugins.scan()
        self._write_status()
        threading.Thread(target=self._watch_plugins, name="plugin-watcher", daemon=True).start()
        watcher = threading.Thread(target=self._watch_pods, name="pod-watch", daemon=True)
        watcher.start()
        _log.info("kubelet stand-in for node %s running", self.settings.node_name)
        while not stop.is_set():  # never stop.wait() here: the SIGTERM handler sets it on this thread
            time.sleep(0.2)
        _log.info("stopping")
        self._wake_all()
        with self._lock:
            threads = [slot.thread for slot in self._pods.values() if slot.thread is not None]
        for thread in threads:
            thread.join(timeout=5)
        self.heartbeat.stop()
        self.plugins.close()

    def _write_status(self) -> None:
        path = self.settings.status_file
        if path is None:
            return
        status = {
            "node": self.settings.node_name,
            "pid": os.getpid(),
            "node_ready": True,
            "plugins": self.plugins.names(),
            "updated": time.time(),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status) + "\n")
        os.replace(tmp, path)

    def _wake_all(self) -> None:
        with self._lock:
            slots = list(self._pods.values())
        for slot in slots:
            slot.wake.set()
        with contextlib.suppress(OSError):
            self._write_status()

    def _watch_plugins(self) -> None:
        while not self._stop.wait(PLUGIN_POLL_S):
            try:
                self.plugins.scan()
            except Exception:
                _log.exception("plugin scan failed")

    # Pod watch ----------------------------------------------------------------------

    def _watch_pods(self) -> None:
        watch_pods(
            self.core,
            f"spec.nodeName={self.settings.node_name}",
            self._stop,
            observe=self._observe,
            forget=self._forget,
            known=self._known,
        )

    def _known(self) -> set[str]:
        with self._lock:
            return set(self._pods)

    def _observe(self, pod: PodView) -> None:
        uid = pod.uid
        with self._lock:
            slot = self._pods.get(uid)
            if slot is None:
                slot = _PodSlot(pod=pod, wake=threading.Event())
                slot.thread = threading.Thread(target=self._drive, args=(uid,), name=f"pod-{pod.name}", daemon=True)
                self._pods[uid] = slot
                slot.thread.start()
            else:
                slot.pod = pod
            slot.wake.set()

    def _forget(self, uid: str) -> None:
        with self._lock:
            slot = self._pods.get(uid)
            if slot is not None:
                slot.gone = True
                slot.wake.set()

    # One thread per pod --------------------------------------------------------------

    def _drive(self, uid: str) -> None:
        backoff = BACKOFF_INITIAL_S
        poll = CLAIM_POLL_INITIAL_S
        started = False
        released = False
        while not self._stop.is_set():
            with self._lock:
                slot = self._pods[uid]
                pod, gone = slot.pod, slot.gone
                slot.wake.clear()
            name = pod.key
            try:
                if gone or pod.deleting:
                    self._terminate(pod, delete=not gone)
                    break
                if pod.terminal:
                    # Its containers have exited (the phase says so): unprepare now, as kubelet does once a
                    # pod is terminal, not only when it is deleted; the API object may stay for a long time.
                    if not released:
                        self._terminate(pod, delete=False)
                        released = True
                        _log.info("pod %s is %s; its claims are unprepared", pod.key, pod.phase)
                    slot.wake.wait()
                    continue
                if not started:
                    slot.tries += 1
                    self._start(pod, slot)
                    started = True
                    backoff = BACKOFF_INITIAL_S
                slot.wake.wait()
            except PodNotReady as err:
                _log.debug("pod %s not ready to start: %s", name, err)
                if not slot.first_wait:
                    slot.first_wait = str(err)
                slot.wake.wait(poll)
                poll = min(poll * 2, CLAIM_POLL_S)
            except PrepareFailed as err:
                _log.warning("pod %s: prepare failed (retry in %.0fs): %s", name, backoff, err)
                self.events.warn(pod, REASON_FAILED_PREPARE, str(err))
                slot.wake.wait(backoff)
                backoff = min(backoff * 2, self.settings.workers_backoff_max)
            except ApiException as err:
                if err.status == 404 and pod.deleting:
                    break
                _log.warning("pod %s: API error %s %s; retrying", name, err.status, err.reason)
                slot.wake.wait(min(backoff, 2.0))
            except Exception:
                _log.exception("pod %s: unexpected error; retrying", name)
                slot.wake.wait(backoff)
                backoff = min(backoff * 2, self.settings.workers_backoff_max)
        with self._lock:
            last = self._pods.get(uid)
            if last is not None and (last.gone or last.pod.deleting):
                self._pods.pop(uid, None)

    def _start(self, pod: PodView, slot: _PodSlot) -> None:
        began = time.monotonic()
        claims = self.dra.claims_of(pod)
        read = time.monotonic()
        if claims:
            with self._lock:
                # Recorded before the call: termination unprepares whatever may have been prepared, and a
                # concurrent termination of another pod sharing a claim sees this pod as a user.
                self._prepared[pod.uid] = list(claims)
                for claim in claims:
                    self._claim_users.setdefault(claim.ref.uid, set()).add(pod.uid)
            self.dra.prepare(claims)
        prepared = time.monotonic()
        if pod.phase != "Running":
            body = running_status(pod, self.settings.host_ip, stamp(now()))
            self.core.patch_namespaced_pod_status(pod.name, pod.namespace, body)
        done = time.monotonic()
        # One line per started pod with where its node-side time went (bench/dra/dra_overhead.py --stages reads it).
        _log.info(
            "pod %s running: total_ms=%.1f wait_ms=%.1f tries=%d claims_ms=%.1f prepare_ms=%.1f status_ms=%.1f"
            " first_wait=%r",
            pod.key,
            (done - slot.seen) * 1000,
            (began - slot.seen) * 1000,
            slot.tries,
            (read - began) * 1000,
            (prepared - read) * 1000,
            (done - prepared) * 1000,
            slot.first_wait,
        )

    def _terminate(self, pod: PodView, *, delete: bool) -> None:
        uid = pod.uid
        with self._lock:
            prepared = self._prepared.pop(uid, [])
            last_users: list[Claim] = []
            for claim in prepared:
                users = self._claim_users.get(claim.ref.uid, set())
                users.discard(uid)
                if not users:
                    self._claim_users.pop(claim.ref.uid, None)
                    last_users.append(claim)
        if last_users:
            self.dra.unprepare(
                pod, last_users, stop=self._stop, warn=self.events.warn, backoff_max_s=self.settings.workers_backoff_max
            )
        if delete:
            delete_terminated(self.core, pod)  # raises PodStillThere or an API error: retried by _drive
            _log.info("pod %s deleted", pod.key)


def _labels(items: Sequence[str], flag: str = "--label") -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} {item!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def parser() -> argparse.ArgumentParser:
    """Command-line flags."""
    p = argparse.ArgumentParser(
        prog="python -m e2e.plane.kubelet", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--node-name", required=True)
    p.add_argument("--kubeconfig", required=True, help="the node's own credentials (system:node:<name>)")
    p.add_argument("--registry-dir", required=True, type=Path, help="where plugins put their *-reg.sock")
    p.add_argument("--cdi-root", required=True, type=Path, help="where the node's CDI spec files live")
    p.add_argument("--host-ip", default="127.0.0.1", help="the node's address, also given to its pods")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="Node label (repeatable)")
    p.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="RESOURCE=QUANTITY",
        help="extra Node capacity and allocatable, e.g. nvidia.com/gpu=8 as a device plugin reports it (repeatable)",
    )
    p.add_argument("--status-file", type=Path, help="JSON written once the node is Ready and on plugin changes")
    p.add_argument("--heartbeat-interval", type=float, default=10.0)
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run until SIGTERM/SIGINT."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s %(levelname)s kubelet[{args.node_name}] %(threadName)s: %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()

    def _signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    load: Callable[..., client.ApiClient] = config.new_client_from_config
    api = load(config_file=args.kubeconfig, persist_config=False)
    settings = Settings(
        node_name=args.node_name,
        registry_dir=args.registry_dir,
        cdi_root=args.cdi_root,
        host_ip=args.host_ip,
        labels=_labels(args.label),
        status_file=args.status_file,
        heartbeat_interval=args.heartbeat_interval,
        extra_capacity=_labels(args.capacity, flag="--capacity"),
    )
    KubeletStandIn(settings, api).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
