"""Kubelet stand-in: what kubelet does for DRA on one node, and nothing else.

    python -m e2e.plane.kubelet --node-name N --kubeconfig NODE_KUBECONFIG \\
        --registry-dir DIR --cdi-root DIR [--label K=V ...] [--host-ip 127.0.0.2] [--status-file F]

* **Plugins**: watches ``--registry-dir`` for ``*-reg.sock`` and registers each
  plugin the way kubelet's plugin manager does (GetInfo, version choice,
  NotifyRegistrationStatus) through ``KubeletPluginClient.discover``; a socket
  that is replaced (driver restart) is registered again.
* **Node**: owns the node heartbeat (``e2e.plane.nodes.NodeHeartbeat``): the Node is
  created with ``--label``s and stays Ready while this process lives.
* **Pods** bound to the node (watch with ``spec.nodeName=N``): for each claim of
  a new pod, the claim name (``resourceClaimName``, or for a template the name
  kube-controller-manager wrote to ``status.resourceClaimStatuses``); wait until
  the claim is allocated and reserved for the pod; ``NodePrepareResources`` for
  the claims with devices of a registered driver; every returned CDI id must
  resolve to a spec file under ``--cdi-root`` (what the container runtime
  would do); then the pod is marked Running through ``pods/status``. A failed
  prepare becomes a Warning Event ``FailedPrepareDynamicResources`` on the pod
  and is retried with backoff. Pods without claims are marked Running at once.
* **Deletion**: a pod with a ``deletionTimestamp`` gets ``NodeUnprepareResources``
  for claims no other pod on the node still uses, then the final delete with
  ``gracePeriodSeconds=0`` and a UID precondition, as kubelet does.

It authenticates as the node (``system:node:<name>`` in ``system:nodes``), so
the Node authorizer and NodeRestriction constrain it exactly as they would a
kubelet: it can read only claims of pods bound to it and write only the
status of those pods.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from e2e.plane import nodes
from gpuplane.driver.plugin import kubelet_client
from gpuplane.driver.prepare import cdi
from gpuplane.driver.prepare.contract import ClaimRef, PrepareResult

_log = logging.getLogger("e2e.plane.kubelet")

GROUP, VERSION = "resource.k8s.io", "v1"
REGISTRATION_SUFFIX = "-reg.sock"
REASON_FAILED_PREPARE = "FailedPrepareDynamicResources"
BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 30.0
CLAIM_POLL_S = 0.2
CLAIM_POLL_INITIAL_S = 0.01
"""First retry after a pod was not ready to start, doubling up to ``CLAIM_POLL_S``. Short because the common
cause right after the bind is a 403 on the claim read while the Node authorizer's graph catches up with
the binding (milliseconds); a fixed 200 ms poll cost half the claim pods 200 ms (bench/dra_overhead --stages)."""
PLUGIN_POLL_S = 0.25


class PodNotReady(Exception):
    """The pod cannot start yet for a reason that is expected to pass (claim not allocated yet, plugin missing)."""


class PrepareFailed(Exception):
    """NodePrepareResources failed for a claim, or its CDI ids do not resolve: reported as an Event."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the stand-in is told on its command line."""

    node_name: str
    registry_dir: Path
    cdi_root: Path
    host_ip: str = "127.0.0.1"
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    status_file: Path | None = None
    heartbeat_interval: float = 10.0
    workers_backoff_max: float = BACKOFF_MAX_S


class PluginRegistry:
    """Kubelet's plugin watcher for DRA: registration sockets in, connected plugin clients out."""

    def __init__(self, registry_dir: Path, on_change: Callable[[], None]) -> None:
        self.registry_dir = registry_dir
        self._on_change = on_change
        self._lock = threading.Lock()
        self._plugins: dict[str, kubelet_client.KubeletPluginClient] = {}
        self._seen: dict[Path, tuple[int, float]] = {}  # socket -> (inode, mtime) registered
        self._by_socket: dict[Path, str] = {}
        self.last_error = ""

    def get(self, driver: str) -> kubelet_client.KubeletPluginClient | None:
        """The registered plugin for ``driver``, if any."""
        with self._lock:
            return self._plugins.get(driver)

    def names(self) -> list[str]:
        """Names of registered drivers."""
        with self._lock:
            return sorted(self._plugins)

    def scan(self) -> None:
        """Register new or replaced sockets; forget removed ones."""
        present: dict[Path, tuple[int, float]] = {}
        with contextlib.suppress(FileNotFoundError):
            for path in self.registry_dir.glob(f"*{REGISTRATION_SUFFIX}"):
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    present[path] = (st.st_ino, st.st_mtime)
        changed = False
        for path in [p for p in self._seen if p not in present]:
            del self._seen[path]
            driver = self._by_socket.pop(path, None)
            if driver is not None:
                with self._lock:
                    old = self._plugins.pop(driver, None)
                if old is not None:
                    old.close()
                _log.info("plugin %s deregistered (socket %s removed)", driver, path)
                changed = True
        for path, identity in present.items():
            if self._seen.get(path) == identity:
                continue
            try:
                plugin = kubelet_client.KubeletPluginClient.discover(path, timeout=10.0)
                # Registration gives up after 10 s; NodePrepare/UnprepareResources get kubelet's 45 s. With 10 s,
                # calls queued behind the driver's per-node lock (MPS daemon starts) hit DEADLINE_EXCEEDED.
                plugin.timeout = kubelet_client.DEFAULT_CALL_TIMEOUT
            except Exception as err:  # the driver may still be starting: try again on the next scan
                self.last_error = f"{path}: {err}"
                continue
            info = plugin.info
            driver = info.name if info is not None else path.name.removesuffix(REGISTRATION_SUFFIX)
            with self._lock:
                old = self._plugins.pop(driver, None)
                self._plugins[driver] = plugin
            if old is not None:
                old.close()
            self._seen[path] = identity
            self._by_socket[path] = driver
            _log.info("plugin %s registered: endpoint %s, api %s", driver, plugin.endpoint, plugin.version)
            changed = True
        if changed:
            self._on_change()

    def close(self) -> None:
        """Close every plugin connection."""
        with self._lock:
            plugins = list(self._plugins.values())
            self._plugins.clear()
        for plugin in plugins:
            plugin.close()


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


@dataclasses.dataclass(frozen=True)
class PodView:
    """The fields of a pod (a plain API dict) the stand-in acts on."""

    uid: str
    name: str
    namespace: str
    deleting: bool
    phase: str
    containers: tuple[tuple[str, str], ...]  # (name, image)
    claims: tuple[tuple[str, str | None, str | None], ...]  # (name, resourceClaimName, templateName)
    generated: Mapping[str, str | None]  # pod claim name -> generated claim name (status)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> PodView:
        """Read a pod dict."""
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        return cls(
            uid=str(meta["uid"]),
            name=str(meta["name"]),
            namespace=str(meta["namespace"]),
            deleting=meta.get("deletionTimestamp") is not None,
            phase=str(status.get("phase") or ""),
            containers=tuple((str(c["name"]), str(c.get("image") or "")) for c in spec.get("containers") or []),
            claims=tuple(
                (str(c["name"]), c.get("resourceClaimName"), c.get("resourceClaimTemplateName"))
                for c in spec.get("resourceClaims") or []
            ),
            generated={str(s["name"]): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []},
        )

    @property
    def key(self) -> str:
        """namespace/name."""
        return f"{self.namespace}/{self.name}"


def stream_lines(response: Any) -> Iterator[str]:
    """The lines of a streamed (watch) HTTP response."""
    buffer = b""
    for chunk in response.stream(amt=65536, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line.decode()
    if buffer.strip():
        yield buffer.decode()


@dataclasses.dataclass(frozen=True)
class _Claim:
    ref: ClaimRef
    drivers: frozenset[str]


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
        self._prepared: dict[str, list[_Claim]] = {}  # pod uid -> claims (maybe) prepared for it
        self._event_counts: dict[str, int] = {}
        self._stop = threading.Event()
        self.plugins = PluginRegistry(settings.registry_dir, self._wake_all)
        self.heartbeat = nodes.NodeHeartbeat(
            settings.node_name,
            api,
            interval=settings.heartbeat_interval,
            labels=settings.labels,
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
        stop.wait()
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
        selector = f"spec.nodeName={self.settings.node_name}"
        while not self._stop.is_set():
            try:
                raw: Any = self.core.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False)
                listed = json.loads(raw.data)
                pods = [PodView.of(item) for item in listed.get("items") or []]
                for pod in pods:
                    self._observe(pod)
                live = {pod.uid for pod in pods}
                with self._lock:
                    vanished = [uid for uid in self._pods if uid not in live]
                for uid in vanished:
                    self._forget(uid)
                version = str(listed["metadata"]["resourceVersion"])
                while not self._stop.is_set():
                    version = self._follow(selector, version)
            except ApiException as err:
                if err.status != 410:  # 410: resource version too old, relist
                    _log.warning("pod watch failed: %s", err.reason)
                    self._stop.wait(1.0)
            except Exception as err:  # connection reset and the like: relist
                _log.warning("pod watch interrupted: %s", err)
                self._stop.wait(1.0)

    def _follow(self, selector: str, version: str) -> str:
        """One watch request from ``version``; returns the last resource version seen."""
        response: Any = self.core.list_pod_for_all_namespaces(
            field_selector=selector,
            resource_version=version,
            watch=True,
            timeout_seconds=60,
            allow_watch_bookmarks=True,
            _preload_content=False,
        )
        try:
            for line in stream_lines(response):
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("message")))
                version = str(obj["metadata"]["resourceVersion"])
                if kind == "BOOKMARK":
                    continue
                pod = PodView.of(obj)
                if kind == "DELETED":
                    self._forget(pod.uid)
                else:
                    self._observe(pod)
                if self._stop.is_set():
                    break
        finally:
            response.release_conn()
        return version

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
                self._event(pod, REASON_FAILED_PREPARE, str(err))
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
        claims = self._claims_of(pod)
        read = time.monotonic()
        if claims:
            self._prepare(pod, claims)
        prepared = time.monotonic()
        if pod.phase != "Running":
            self._mark_running(pod)
        done = time.monotonic()
        # One line per started pod with where its node-side time went (bench/dra_overhead.py --stages reads it).
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

    @staticmethod
    def _claim_names(pod: PodView) -> list[str]:
        """Claim names of the pod's ``spec.resourceClaims``, template ones from the pod status."""
        out = []
        for entry, claim_name, template in pod.claims:
            if claim_name:
                out.append(claim_name)
            elif template:
                if entry not in pod.generated:
                    raise PodNotReady(f"claim for {entry!r} (template) not created yet")
                generated = pod.generated[entry]
                if generated:  # None: the template yields no claim for this pod
                    out.append(generated)
        return out

    def _claims_of(self, pod: PodView) -> list[_Claim]:
        namespace = pod.namespace
        claims = []
        for claim_name in self._claim_names(pod):
            try:
                obj = cast(
                    dict[str, Any],
                    self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", claim_name),
                )
            except ApiException as err:
                # 403 while the Node authorizer's graph has not seen the binding yet; 404 before creation.
                if err.status in (403, 404):
                    raise PodNotReady(f"claim {claim_name}: {err.status} {err.reason}") from err
                raise
            status = obj.get("status") or {}
            allocation = status.get("allocation")
            if not allocation:
                raise PodNotReady(f"claim {claim_name} is not allocated yet")
            reserved = {r.get("uid") for r in status.get("reservedFor") or []}
            if pod.uid not in reserved:
                raise PodNotReady(f"claim {claim_name} is not reserved for the pod yet")
            results = (allocation.get("devices") or {}).get("results") or []
            drivers = frozenset(str(r["driver"]) for r in results)
            meta = obj["metadata"]
            claims.append(_Claim(ClaimRef(namespace=namespace, uid=meta["uid"], name=meta["name"]), drivers))
        return claims

    def _prepare(self, pod: PodView, claims: Sequence[_Claim]) -> None:
        by_driver: dict[str, list[ClaimRef]] = {}
        for claim in claims:
            for driver in claim.drivers:
                by_driver.setdefault(driver, []).append(claim.ref)
        with self._lock:
            # Recorded before the call: termination unprepares whatever may have been prepared, and a
            # concurrent termination of another pod sharing a claim sees this pod as a user.
            self._prepared[pod.uid] = list(claims)
            for claim in claims:
                self._claim_users.setdefault(claim.ref.uid, set()).add(pod.uid)
        for driver, refs in sorted(by_driver.items()):
            plugin = self.plugins.get(driver)
            if plugin is None:
                raise PrepareFailed(f"DRA driver {driver} is not registered on node {self.settings.node_name}")
            try:
                results = plugin.prepare(refs)
            except Exception as err:
                raise PrepareFailed(f"NodePrepareResources with driver {driver} failed: {err}") from err
            for ref in refs:
                result = results.get(ref.uid)
                if result is None:
                    raise PrepareFailed(f"driver {driver} returned no result for claim {ref.name}")
                if result.error:
                    raise PrepareFailed(f"claim {ref.name}: {result.error}")
                self._check_cdi(ref, result)

    def _check_cdi(self, ref: ClaimRef, result: PrepareResult) -> None:
        for device in result.devices:
            if not device.cdi_device_ids:
                raise PrepareFailed(f"claim {ref.name}: device {device.device_name} has no CDI ids")
            for cdi_id in device.cdi_device_ids:
                if cdi.resolve(self.settings.cdi_root, cdi_id) is None:
                    raise PrepareFailed(
                        f"claim {ref.name}: CDI device {cdi_id} has no spec in {self.settings.cdi_root}"
                    )

    def _mark_running(self, pod: PodView) -> None:
        now = _stamp(_now())
        ip = self.settings.host_ip

        def condition(kind: str) -> dict[str, str]:
            return {"type": kind, "status": "True", "lastTransitionTime": now}

        containers = [
            {
                "name": cname,
                "image": image,
                "imageID": f"fake://{image or 'none'}",
                "containerID": "fake://" + hashlib.sha256(f"{pod.uid}/{cname}".encode()).hexdigest()[:32],
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for cname, image in pod.containers
        ]
        body = {
            "status": {
                "phase": "Running",
                "hostIP": ip,
                "hostIPs": [{"ip": ip}],
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": now,
                "conditions": [
                    condition(kind)
                    for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled")
                ],
                "containerStatuses": containers,
            }
        }
        self.core.patch_namespaced_pod_status(pod.name, pod.namespace, body)

    def _terminate(self, pod: PodView, *, delete: bool) -> None:
        uid = pod.uid
        with self._lock:
            prepared = self._prepared.pop(uid, [])
            last_users: list[_Claim] = []
            for claim in prepared:
                users = self._claim_users.get(claim.ref.uid, set())
                users.discard(uid)
                if not users:
                    self._claim_users.pop(claim.ref.uid, None)
                    last_users.append(claim)
        if last_users:
            self._unprepare(pod, last_users)
        if delete:
            try:
                self.core.delete_namespaced_pod(
                    pod.name,
                    pod.namespace,
                    grace_period_seconds=0,
                    body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)),
                )
            except ApiException as err:
                if err.status not in (404, 409):  # gone already, or a different pod by now
                    raise
            _log.info("pod %s deleted", pod.key)

    def _unprepare(self, pod: PodView, claims: Sequence[_Claim]) -> None:
        delay = BACKOFF_INITIAL_S
        pending = {(driver, claim.ref) for claim in claims for driver in claim.drivers}
        while pending and not self._stop.is_set():
            errors: list[str] = []
            for driver in sorted({d for d, _ in pending}):
                refs = sorted((r for d, r in pending if d == driver), key=lambda r: r.uid)
                plugin = self.plugins.get(driver)
                if plugin is None:
                    errors.append(f"DRA driver {driver} is not registered")
                    continue
                try:
                    results = plugin.unprepare(refs)
                except Exception as err:
                    errors.append(f"NodeUnprepareResources with {driver} failed: {err}")
                    continue
                for ref in refs:
                    result = results.get(ref.uid)
                    if result is not None and not result.error:
                        pending.discard((driver, ref))
                    else:
                        errors.append(f"claim {ref.name}: {result.error if result else 'no result'}")
            if not pending:
                return
            _log.warning("unprepare for pod %s failed, retrying: %s", pod.key, "; ".join(errors))
            self._event(pod, "FailedUnprepareDynamicResources", "; ".join(errors))
            self._stop.wait(delay)
            delay = min(delay * 2, self.settings.workers_backoff_max)

    def _event(self, pod: PodView, reason: str, message: str) -> None:
        """A Warning Event on the pod; repeats of one message bump its count, like kubelet's recorder.

        Nodes may create and patch events but not read them, so the counts are remembered here.
        """
        namespace = pod.namespace
        digest = hashlib.sha256(f"{reason}/{message}".encode()).hexdigest()[:10]
        name = f"{pod.name}.{digest}"
        now = _now()
        with self._lock:
            count = self._event_counts.get(name, 0) + 1
            self._event_counts[name] = count
        try:
            if count > 1:
                self.core.patch_namespaced_event(name, namespace, {"count": count, "lastTimestamp": _stamp(now)})
                return
        except ApiException as err:
            if err.status != 404:
                _log.warning("could not update event %s: %s", name, err.reason)
                return
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod.name, namespace=namespace, uid=pod.uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning",
            first_timestamp=now,
            last_timestamp=now,
            count=count,
            source=client.V1EventSource(component="kubelet", host=self.settings.node_name),
            reporting_component="kubelet",
            reporting_instance=self.settings.node_name,
        )
        try:
            self.core.create_namespaced_event(namespace, body)
        except ApiException as err:
            _log.warning("could not record event %s: %s", reason, err.reason)


def _labels(items: Sequence[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--label {item!r}: expected KEY=VALUE")
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
    )
    KubeletStandIn(settings, api).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
