"""Pods as the kubelet stand-in reads them (:func:`watch_pods`, :class:`PodView`) and what it writes about them.

:func:`running_status` is the ``pods/status`` body that marks a pod Running (pure);
:class:`PodEvents` records Warning Events on pods the way kubelet's recorder does (repeats bump the
count; nodes may create and patch Events but not read them, so the counts are kept here).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

_log = logging.getLogger("e2e.plane.kubelet")
TERMINAL_PHASES = ("Succeeded", "Failed")


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


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
    extended_claim: str = ""  # the scheduler's claim for extended resources backed by DRA (status)

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
            extended_claim=str((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName") or ""),
        )

    @property
    def terminal(self) -> bool:
        """Every container has exited for good (phase Succeeded or Failed): kubelet releases the pod's devices."""
        return self.phase in TERMINAL_PHASES

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


def running_status(pod: PodView, ip: str, when: str) -> dict[str, Any]:
    """The ``pods/status`` patch of a started pod: Running, its conditions, one running status per container."""

    def condition(kind: str) -> dict[str, str]:
        return {"type": kind, "status": "True", "lastTransitionTime": when}

    containers = [
        {
            "name": cname,
            "image": image,
            "imageID": f"fake://{image or 'none'}",
            "containerID": "fake://" + hashlib.sha256(f"{pod.uid}/{cname}".encode()).hexdigest()[:32],
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": when}},
        }
        for cname, image in pod.containers
    ]
    return {
        "status": {
            "phase": "Running",
            "hostIP": ip,
            "hostIPs": [{"ip": ip}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": when,
            "conditions": [
                condition(kind)
                for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled")
            ],
            "containerStatuses": containers,
        }
    }


class PodEvents:
    """Warning Events on pods, from one node (writes Events)."""

    def __init__(self, core: client.CoreV1Api, node_name: str) -> None:
        self.core = core
        self.node_name = node_name
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def warn(self, pod: PodView, reason: str, message: str) -> None:
        """A Warning Event on the pod; repeats of one message bump its count, like kubelet's recorder.

        Nodes may create and patch events but not read them, so the counts are remembered here.
        """
        namespace = pod.namespace
        digest = hashlib.sha256(f"{reason}/{message}".encode()).hexdigest()[:10]
        name = f"{pod.name}.{digest}"
        moment = now()
        with self._lock:
            count = self._counts.get(name, 0) + 1
            self._counts[name] = count
        try:
            if count > 1:
                self.core.patch_namespaced_event(name, namespace, {"count": count, "lastTimestamp": stamp(moment)})
                return
        except ApiException as err:
            if err.status != 404:
                _log.warning("could not update event %s: %s", name, err.reason)
                return
        except Exception as err:  # the apiserver is down: an Event is best effort, as for kubelet's recorder
            _log.warning("could not update event %s: %s", name, err)
            return
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod.name, namespace=namespace, uid=pod.uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning",
            first_timestamp=moment,
            last_timestamp=moment,
            count=count,
            source=client.V1EventSource(component="kubelet", host=self.node_name),
            reporting_component="kubelet",
            reporting_instance=self.node_name,
        )
        try:
            self.core.create_namespaced_event(namespace, body)
        except ApiException as err:
            _log.warning("could not record event %s: %s", reason, err.reason)
        except Exception as err:  # the apiserver is down (a urllib3 error): never fail the pod's worker for it
            _log.warning("could not record event %s: %s", reason, err)


class PodStillThere(RuntimeError):
    """The final delete of a pod answered 404, but the pod is still there: try again later."""


def delete_terminated(core: client.CoreV1Api, pod: PodView) -> None:
    """The final delete kubelet makes for a terminated pod (grace 0, UID precondition); raises unless it is gone.

    A 404 is trusted only when a read agrees: right after kube-apiserver starts, NodeRestriction answers a
    node's pod delete from its pod informer, and says 404 until that informer has synced although the pod
    exists. Kubelet retries any failed delete on its next status sync; so does the stand-in (``PodStillThere``).
    """
    options = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.uid))
    try:
        core.delete_namespaced_pod(pod.name, pod.namespace, grace_period_seconds=0, body=options)
        return
    except ApiException as err:
        if err.status == 409:  # a different pod by now
            return
        if err.status != 404:
            raise
    try:
        current = core.read_namespaced_pod(pod.name, pod.namespace)
    except ApiException as err:
        if err.status == 404:
            return
        raise
    if current.metadata is not None and current.metadata.uid == pod.uid:
        raise PodStillThere(f"pod {pod.key}: its delete answered 404 but it is still there")


def watch_pods(
    core: client.CoreV1Api,
    selector: str,
    stop: threading.Event,
    *,
    observe: Callable[[PodView], None],
    forget: Callable[[str], None],
    known: Callable[[], set[str]],
) -> None:
    """List and watch the pods ``selector`` picks until ``stop``: ``observe`` each, ``forget`` those gone (by uid).

    ``known`` gives the uids observed so far, so that a relist forgets the pods deleted meanwhile.
    Relists after an expired resource version (410) or a broken connection, as an informer does.
    """
    while not stop.is_set():
        try:
            raw: Any = core.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False)
            listed = json.loads(raw.data)
            pods = [PodView.of(item) for item in listed.get("items") or []]
            for pod in pods:
                observe(pod)
            live = {pod.uid for pod in pods}
            for uid in known() - live:
                forget(uid)
            version = str(listed["metadata"]["resourceVersion"])
            while not stop.is_set():
                version = _follow(core, selector, version, stop, observe=observe, forget=forget)
        except ApiException as err:
            if err.status != 410:  # 410: resource version too old, relist
                _log.warning("pod watch failed: %s", err.reason)
                stop.wait(1.0)
        except Exception as err:  # connection reset and the like: relist
            _log.warning("pod watch interrupted: %s", err)
            stop.wait(1.0)


def _follow(
    core: client.CoreV1Api,
    selector: str,
    version: str,
    stop: threading.Event,
    *,
    observe: Callable[[PodView], None],
    forget: Callable[[str], None],
) -> str:
    """One watch request from ``version``; returns the last resource version seen."""
    response: Any = core.list_pod_for_all_namespaces(
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
                forget(pod.uid)
            else:
                observe(pod)
            if stop.is_set():
                break
    finally:
        response.release_conn()
    return version
