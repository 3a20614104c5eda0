"""What the rolling-upgrade tests measure: pods with claims created and deleted throughout, steady pods, leak checks.

* :class:`Churn`: one thread per claim kind (whole GPU, MIG 1g.10gb, MPS bronze) that
  keeps creating a ResourceClaim and a pod using it on the real nodes, waits until the
  pod runs (kubelet prepared the claim through whichever plugin instance it picked),
  deletes both (gracefully, as a user does), waits until the node's driver has
  unprepared the claim and starts over. It counts the pods that ran (claims prepared), the
  pods that did not within the limit, and at the end kubelet's
  ``FailedPrepareDynamicResources`` / ``FailedUnprepareDynamicResources`` Events;
* :func:`steady` / :func:`disruptions`: one long-lived pod per kind created before a
  rollout; after it, each must be the same pod, the same container (containerd id),
  never restarted, its claim prepared with the same devices (the checkpoint record:
  devices, CDI ids, MIG instance, MPS daemon), and, reported apart, the same MPS
  control daemon process (host pid);
* :func:`leaks`: on every node, nothing but the steady claims' state: checkpoint
  records, CDI spec files, simulated MIG instances, MPS daemon dirs;
* :func:`wait_driver_replaced`: the driver DaemonSet's rollout finished (every pod of ``before``
  gone, every node's pod updated and available).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.plane import identity, realinstall
from e2e.plane.realnode.plan import REAL_NODE_LABEL
from gpuplane.driver.prepare import cdi
from gpuplane.driver.sharing.mps_procs import MpsProcesses
from tests.e2e.installkit import Install

NS = "gpuplane-rollout"
KINDS: dict[str, tuple[str, str | None]] = {
    "gpu": ("gpu.gpuplane.dev", None),
    "mig": ("mig.gpuplane.dev", 'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"'),
    "mps": ("mps-bronze.gpu.gpuplane.dev", None),
}
RUN_TIMEOUT_S = 240.0
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_POD_COMPONENT = "app.kubernetes.io/component=mps-control-daemon"
FAILED_REASONS = ("FailedPrepareDynamicResources", "FailedUnprepareDynamicResources")


def claim_body(name: str, kind: str) -> dict[str, Any]:
    """A ResourceClaim for one device of ``kind``."""
    class_name, selector = KINDS[kind]
    exactly: dict[str, Any] = {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": 1}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod_body(name: str, claim: str) -> dict[str, Any]:
    """A pause pod on a real node using ``claim``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "rollout"}},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "automountServiceAccountToken": False,
            # Not 0: a delete with grace 0 removes the pod from the API before kubelet has stopped it and
            # unprepared its claim, and the next claim is allocated the device the driver still holds.
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


class Api:
    """Core and ResourceClaim calls on one API client of its own (one per thread)."""

    def __init__(self, install: Install) -> None:
        self._client = identity.new_client(install.real.gpu.cluster.kubeconfig)
        self.core = client.CoreV1Api(self._client)
        self.custom = client.CustomObjectsApi(self._client)

    def close(self) -> None:
        self._client.close()

    def create(self, name: str, kind: str) -> None:
        self.custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", NS, "resourceclaims", claim_body(name, kind)
        )
        self.core.create_namespaced_pod(NS, pod_body(name, name))

    def phase(self, name: str) -> tuple[str, dict[str, Any]]:
        pod = self._client.sanitize_for_serialization(self.core.read_namespaced_pod(name, NS))
        return str(pod.get("status", {}).get("phase", "")), pod

    def wait_running(self, name: str, timeout: float = RUN_TIMEOUT_S) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            phase, pod = self.phase(name)
            if phase == "Running":
                return pod
            time.sleep(0.5)
        return None

    def delete(self, name: str) -> None:
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespaced_pod(name, NS)
        with contextlib.suppress(client.ApiException):
            self.custom.delete_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims", name)

    def claim_uid(self, name: str) -> str:
        claim = self.custom.get_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims", name)
        return str(self._client.sanitize_for_serialization(claim)["metadata"]["uid"])

    def wait_deleted(self, name: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.core.read_namespaced_pod(name, NS)
            except client.ApiException as err:
                if err.status == 404:
                    return
            time.sleep(0.5)


@dataclasses.dataclass
class Figures:
    """What one churn run counted."""

    prepared: int = 0  # pods that ran: their claim prepared
    not_running: list[str] = dataclasses.field(default_factory=list)
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    failed_events: list[str] = dataclasses.field(default_factory=list)  # a plugin call failed
    fetch_refused: list[str] = dataclasses.field(default_factory=list)  # kubelet's read of the claim refused
    seconds_to_run: list[float] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        worst = max(self.seconds_to_run, default=0.0)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.by_kind.items()))
        return (
            f"claims prepared {self.prepared} ({kinds}), pods not running in {RUN_TIMEOUT_S:.0f}s "
            f"{len(self.not_running)}, failed prepares/unprepares {len(self.failed_events)}, "
            f"kubelet claim reads refused by the node authorizer (no plugin called, retried) "
            f"{len(self.fetch_refused)}, slowest pod to run {worst:.1f}s"
        )


class Churn:
    """Pods with claims of every kind created and deleted until :meth:`stop`."""

    def __init__(self, install: Install, tag: str) -> None:
        self.install = install
        self.tag = tag
        self.figures = Figures()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in KINDS]
        self.errors: list[str] = []

    def __enter__(self) -> Churn:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> Figures:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=RUN_TIMEOUT_S + 180)
        events = failed_events(self.install, prefix=f"{self.tag}-")
        self.figures.fetch_refused = [e for e in events if refused_fetch(e)]
        self.figures.failed_events = [e for e in events if not refused_fetch(e)]
        return self.figures

    def _run(self, kind: str) -> None:
        api = Api(self.install)
        number = 0
        try:
            while not self._stop.is_set():
                name = f"{self.tag}-{kind}-{number}"
                number += 1
                began = time.monotonic()
                held: tuple[str, str] | None = None  # (node, claim uid) once the pod ran
                try:
                    api.create(name, kind)
                    pod = api.wait_running(name)
                    if pod is not None:
                        held = (pod["spec"]["nodeName"], api.claim_uid(name))
                    with self._lock:
                        if pod is None:
                            self.figures.not_running.append(name)
                        else:
                            self.figures.prepared += 1
                            self.figures.by_kind[kind] = self.figures.by_kind.get(kind, 0) + 1
                            self.figures.seconds_to_run.append(time.monotonic() - began)
                finally:
                    api.delete(name)
                    api.wait_deleted(name)
                    if held is not None:  # as a user who deletes and recreates: the old claim is released first
                        self._wait_unprepared(*held)
        except Exception as err:  # reported by the test: a churn thread must not die silently
            self.errors.append(f"{kind}: {err!r}")
        finally:
            api.close()

    def _wait_unprepared(self, node_name: str, claim_uid: str, timeout: float = 120.0) -> None:
        node = self.install.real.node(node_name)
        deadline = time.monotonic() + timeout
        while claim_uid in self.install.real.checkpoint(node).claims:
            if time.monotonic() > deadline:
                self.errors.append(f"claim {claim_uid} still prepared on {node_name} {timeout:.0f}s after its pod went")
                return
            time.sleep(0.5)


def refused_fetch(event: str) -> bool:
    """kubelet's GET of the claim was refused (node authorizer) before it called any plugin."""
    return "fetch ResourceClaim" in event and "is forbidden" in event and "no relationship found" in event


def failed_events(install: Install, prefix: str = "") -> list[str]:
    """kubelet's failed prepare/unprepare Events in the churn namespace (for pods named ``prefix``...)."""
    events = install.kubectl_json("get", "events", "-n", NS)["items"]
    return [
        f"{e['involvedObject']['name']}: {e['reason']} x{e.get('count', 1)}: {e['message']}"
        for e in events
        if e["reason"] in FAILED_REASONS and e["involvedObject"]["name"].startswith(prefix)
    ]


@dataclasses.dataclass(frozen=True)
class SteadyPod:
    """A long-lived pod and what it must keep."""

    name: str
    kind: str
    node: str
    pod_uid: str
    container_id: str
    claim_uid: str
    devices: tuple[tuple[str, tuple[str, ...], str | None], ...]  # (device, CDI ids, MIG uuid)
    mps_daemon: bool
    mps_pids: tuple[int, ...]  # host pids of the claim's MPS control daemon: the same process must serve on


def _record(install: Install, api: Api, name: str, kind: str) -> SteadyPod:
    pod = api.wait_running(name)
    assert pod is not None, f"steady pod {name} did not run"
    node = install.real.node(pod["spec"]["nodeName"])
    claim = api._client.sanitize_for_serialization(
        api.custom.get_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims", name)
    )
    uid = claim["metadata"]["uid"]
    record = install.real.checkpoint(node).claims[uid]
    assert record.phase == "PrepareCompleted", (name, record.phase)
    devices = tuple((d.device, tuple(d.cdi_ids), d.mig.mig_uuid if d.mig is not None else None) for d in record.devices)
    (status,) = pod["status"]["containerStatuses"]
    pids = tuple(sorted(pid for pid, pipe in _daemons(node.mps_root) if pipe.parent.name == uid))
    return SteadyPod(
        name, kind, node.name, pod["metadata"]["uid"], status["containerID"], uid, devices, record.mps_daemon, pids
    )


def _daemons(mps_root: Path) -> list[tuple[int, Path]]:
    """(host pid, pipe dir) of every MPS control daemon serving a pipe dir under ``mps_root``."""
    return list(MpsProcesses(MPS_CONTROL, mps_root, Path("/proc")).scan(None))


def steady(install: Install, tag: str, kinds: tuple[str, ...] = tuple(KINDS)) -> list[SteadyPod]:
    """One running pod per claim kind (every kind unless ``kinds`` says), recorded."""
    api = Api(install)
    try:
        for kind in kinds:
            api.create(f"{tag}-{kind}", kind)
        return [_record(install, api, f"{tag}-{kind}", kind) for kind in kinds]
    finally:
        api.close()


def disruptions(install: Install, pods: list[SteadyPod]) -> tuple[list[str], list[str]]:
    """How each steady pod differs from its record: (pod, container or devices changed; MPS daemon replaced).

    Both empty: undisturbed, same devices, the same MPS control daemon process serving on.
    """
    api = Api(install)
    found: list[str] = []
    daemons: list[str] = []
    try:
        for want in pods:
            pod = api.wait_running(want.name, timeout=5)
            if pod is None:
                found.append(f"{want.name}: not running")
                continue
            now = _record(install, api, want.name, want.kind)
            (status,) = pod["status"]["containerStatuses"]
            if status.get("restartCount", 0):
                found.append(f"{want.name}: restarted {status['restartCount']}x")
            if dataclasses.replace(now, mps_pids=()) != dataclasses.replace(want, mps_pids=()):
                found.append(f"{want.name}: was {want}, now {now}")
            if now.mps_pids != want.mps_pids:
                daemons.append(f"{want.name}: MPS control daemon pids {list(want.mps_pids)} -> {list(now.mps_pids)}")
    finally:
        api.close()
    return found, daemons


def leaks(install: Install, keep: list[SteadyPod]) -> list[str]:
    """State on the nodes that no steady claim owns: checkpoint records, CDI specs, MIG instances, MPS dirs."""
    found: list[str] = []
    for node in install.nodes:
        wanted = {p.claim_uid for p in keep if p.node == node.name}
        claims = install.real.checkpoint(node).claims
        found += [f"{node.name}: checkpoint record {u}" for u in set(claims) - wanted]
        specs = {p.name for p in node.cdi_root.glob("*.json")}
        found += [f"{node.name}: CDI spec {s}" for s in specs - {cdi.spec_path(node.cdi_root, u).name for u in wanted}]
        owned = {
            (d.mig.parent_uuid, d.mig.gi_id)
            for u in wanted & set(claims)
            for d in claims[u].devices
            if d.mig is not None and d.mig.gi_id is not None
        }
        for gpu_uuid, gpu in install.real.sim_state(node)["gpus"].items():
            for gi in gpu["gis"]:
                gi_id = int(gi["gi_id"])
                if (gpu_uuid, gi_id) not in owned:
                    found.append(f"{node.name}: MIG instance {gpu_uuid}/{gi_id}")
        mps = {p.name for p in node.mps_root.iterdir()} if node.mps_root.is_dir() else set()
        found += [f"{node.name}: MPS daemon dir {d}" for d in mps - {p.claim_uid for p in keep if p.mps_daemon}]
        found += [f"{node.name}: MPS daemon pod {name}" for name in daemon_pods(install, node.name, wanted)]
    return found


def explain_daemon_pods(install: Install, leaks: list[str]) -> list[str]:
    """For each leaked daemon pod: its phase, container state, probe, claim dir and Events (for the log)."""
    lines: list[str] = []
    for leak in leaks:
        if ": MPS daemon pod " not in leak:
            continue
        node_name, name = leak.split(": MPS daemon pod ")
        pod = install.kubectl_json("get", "pod", "-n", "gpuplane-system", name)
        (status,) = pod["status"].get("containerStatuses") or [{}]
        uid = pod["metadata"].get("annotations", {}).get("gpuplane.dev/claim-uid", "")
        claim_dir = install.real.node(node_name).mps_root / uid
        probe = pod["spec"]["containers"][0].get("livenessProbe")
        lines.append(
            f"{name}: phase {pod['status'].get('phase')}, created {pod['metadata'].get('creationTimestamp')}, "
            f"state {status.get('state')}, restarts {status.get('restartCount')}, probe {probe}, "
            f"claim dir {claim_dir} exists {claim_dir.exists()} "
            f"(record {(claim_dir / 'daemon.json').exists()})"
        )
        selector = f"--field-selector=involvedObject.name={name}"
        events = install.kubectl_json("get", "events", "-n", "gpuplane-system", selector)
        lines += [f"  event {e['reason']}: {e['message']}" for e in events["items"]]
    return lines


def daemon_pods(install: Install, node: str, keep: set[str]) -> list[str]:
    """This node's MPS daemon pods (``--mps-daemons=pod``) not ended whose claim is not in ``keep``.

    A driver older than daemon pods (N-1) stops a daemon through its control socket without
    deleting its pod: that pod ends Succeeded and is not counted (the next newer driver deletes it).
    """
    pods = install.kubectl_json(
        "get", "pods", "-n", "gpuplane-system", "-l", f"{MPS_POD_COMPONENT},gpuplane.dev/node={node}"
    )["items"]
    return sorted(
        p["metadata"]["name"]
        for p in pods
        if p["metadata"].get("annotations", {}).get("gpuplane.dev/claim-uid") not in keep
        and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    )


def wait_driver_replaced(
    install: Install, what: str, before: set[str], began: float, *, one_plugin_per_node: bool = False
) -> None:
    """Until no pod of ``before`` (uids) is left and all new ones are updated and available (and, with
    ``one_plugin_per_node``, node 0's kubelet sees one plugin socket); fail 420 s after ``began``."""
    while True:
        pods, status = install.driver_pods(), install.daemonset()["status"]
        desired = status.get("desiredNumberScheduled", 0)
        counts = (status.get("updatedNumberScheduled"), status.get("numberAvailable"), len(pods))
        sockets_ok = not one_plugin_per_node or len(realinstall.registration_sockets(install.nodes[0])) == 1
        if not {p["metadata"]["uid"] for p in pods} & before and counts == (desired,) * 3 and sockets_ok:
            return
        assert time.monotonic() - began < 420, f"{what}: rollout did not finish: {status}"
        time.sleep(0.5)
