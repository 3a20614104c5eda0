"""Node objects that stand in for kubelets: created, kept Ready, their Lease renewed.

``NodeHeartbeat(node_name, api)`` creates (or adopts) a Node with a Ready
condition and capacity, and a background thread renews its Lease in
``kube-node-lease`` and its Ready condition every ``interval`` seconds, so the
node-lifecycle controller never taints it not-ready and the scheduler places
pods on it. ``parse_node_spec`` reads the ``--nodes`` spec of ``python -m e2e up``.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import build
from e2e.plane import identity

KUBELET_VERSION = build.read_pins(build.MODULE_DIR / "go.mod").kubernetes
"""What a stand-in node reports as its kubelet: the release the real kubelets of this run are built from."""

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
DEFAULT_CAPACITY: Mapping[str, str] = {"cpu": "64", "memory": "512Gi", "pods": "110"}

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NodeGroup:
    """``count`` simulated nodes of hardware ``profile`` (e.g. ``hgx-h100``)."""

    profile: str
    count: int


def parse_node_spec(spec: str) -> tuple[NodeGroup, ...]:
    """``"hgx-h100:2,gb200-nvl72:4"`` -> two NodeGroups; a bare profile means one node."""
    groups = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        profile, _, count = item.partition(":")
        if not profile or (count and not count.isdigit()) or count == "0":
            raise ValueError(f"bad node spec item {item!r}: expected PROFILE[:COUNT] with COUNT >= 1")
        groups.append(NodeGroup(profile=profile, count=int(count or 1)))
    return tuple(groups)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeHeartbeat:
    """Create Node ``node_name`` and keep it Ready until ``stop()``."""

    def __init__(
        self,
        node_name: str,
        api: client.ApiClient,
        *,
        interval: float = 10.0,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        delete_on_stop: bool = False,
        internal_ip: str = "127.0.0.1",
    ) -> None:
        self.node_name = node_name
        self.internal_ip = internal_ip
        self.interval = interval
        self.labels = dict(labels or {})
        self.capacity = dict(DEFAULT_CAPACITY if capacity is None else capacity)
        self.delete_on_stop = delete_on_stop
        self._core = client.CoreV1Api(api)
        self._coordination = client.CoordinationV1Api(api)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0
        self.last_error: Exception | None = None

    def __enter__(self) -> NodeHeartbeat:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Create the Node and its Lease, mark it Ready, and start the heartbeat thread."""
        if self._thread is not None:
            raise RuntimeError(f"heartbeat for {self.node_name} already started")
        self._ensure_node()
        self.beat()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.node_name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeat thread (and delete the Node if ``delete_on_stop``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 30)
            self._thread = None
        if self.delete_on_stop:
            try:
                self._core.delete_node(self.node_name)
            except ApiException as err:
                if err.status != 404:
                    raise

    def wait_schedulable(self, timeout: float = 60.0) -> None:
        """Wait until the node-lifecycle controller has lifted the not-ready taint admission put on."""
        deadline = time.monotonic() + timeout
        while True:
            node = self._core.read_node(self.node_name)
            taints = [
                t.key
                for t in ((node.spec.taints if node.spec else None) or [])
                if t.key.startswith("node.kubernetes.io/")
            ]
            if not taints:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {self.node_name} still has taints {taints} after {timeout:.0f}s")
            time.sleep(0.5)

    def beat(self) -> None:
        """Renew the Lease and the Ready condition once."""
        now = _now()
        self._renew_lease(now)
        self._core.patch_node_status(self.node_name, self._status(now))
        self.beats += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
                self.last_error = None
            except Exception as err:  # keep beating through a transient apiserver error
                self.last_error = err
                _log.warning("heartbeat for node %s failed: %s", self.node_name, err)

    def _ensure_node(self) -> None:
        labels = {"kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux", **self.labels}
        body = client.V1Node(
            api_version="v1", kind="Node", metadata=client.V1ObjectMeta(name=self.node_name, labels=labels)
        )
        try:
            self._core.create_node(body)
        except ApiException as err:
            if err.status != 409:
                raise
            self._core.patch_node(self.node_name, {"metadata": {"labels": labels}})

    def _status(self, now: datetime.datetime) -> dict[str, Any]:
        stamp = _rfc3339(now)

        def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }

        return {
            "status": {
                "capacity": self.capacity,
                "allocatable": self.capacity,
                "conditions": [
                    condition("Ready", "True", "KubeletReady", "gpuplane e2e heartbeat"),
                    condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                    condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                    condition("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                ],
                "addresses": [
                    {"type": "InternalIP", "address": self.internal_ip},
                    {"type": "Hostname", "address": self.node_name},
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": KUBELET_VERSION,
                    "kubeProxyVersion": "",
                    "containerRuntimeVersion": "fake://0",
                    "kernelVersion": "",
                    "osImage": "gpuplane e2e",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            }
        }

    def _renew_lease(self, now: datetime.datetime) -> None:
        spec = {
            "holderIdentity": self.node_name,
            "leaseDurationSeconds": LEASE_DURATION_S,
            "renewTime": _micro(now),
        }
        try:
            self._coordination.patch_namespaced_lease(self.node_name, LEASE_NAMESPACE, {"spec": spec})
        except ApiException as err:
            if err.status != 404:
                raise
            node = self._core.read_node(self.node_name)
            owner = client.V1OwnerReference(
                api_version="v1",
                kind="Node",
                name=self.node_name,
                uid=node.metadata.uid if node.metadata else "",
            )
            body = client.V1Lease(
                api_version="coordination.k8s.io/v1",
                kind="Lease",
                metadata=client.V1ObjectMeta(name=self.node_name, namespace=LEASE_NAMESPACE, owner_references=[owner]),
                spec=client.V1LeaseSpec(
                    holder_identity=self.node_name, lease_duration_seconds=LEASE_DURATION_S, renew_time=now
                ),
            )
            self._coordination.create_namespaced_lease(LEASE_NAMESPACE, body)


def remove_from_api(kubeconfig: Path, names: Iterable[str], out: Callable[[str], None]) -> None:
    """Delete each node and its ResourceSlices (a gone node is fine); stop at the first connection error."""
    try:
        api = identity.new_client(kubeconfig)
    except Exception as err:  # the control plane may be gone already
        out(f"cannot remove nodes from the API: {err}")
        return
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    try:
        for name in names:
            try:
                listed = cast(
                    dict[str, Any],
                    custom.list_cluster_custom_object(
                        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={name}"
                    ),
                )
                for item in listed.get("items", []):
                    custom.delete_cluster_custom_object(
                        "resource.k8s.io", "v1", "resourceslices", item["metadata"]["name"]
                    )
                core.delete_node(name)
            except ApiException as err:
                if err.status != 404:
                    out(f"removing node {name} from the API failed: {err.status} {err.reason}")
            except Exception as err:  # connection refused: the control plane stopped first
                out(f"removing node {name} from the API failed: {err}")
                return
    finally:
        close: Callable[[], None] = api.close
        close()
