"""What a real-cluster replay records: pods' and claims' lifecycles from two watches, and slice-write counters.

:class:`Recorder` follows the replay namespace's pods (gate lifted, bound, node, the steer's node
affinity) and ResourceClaims (allocated devices, released); :func:`slice_writes` reads each
driver's ``gpuplane_driver_resourceslice_writes_total`` and :func:`apiserver_slice_requests` the
apiserver's ``apiserver_request_total`` for resourceslices. Used by :mod:`bench.kube.kube_replay`.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from e2e.cluster import handle as cluster
from e2e.plane import kubelet_pods, simnodes

NAMESPACE = "replay"


@dataclass
class PodRecord:
    """What happened to one request's pod (wall times, time.time())."""

    index: int
    shape: str
    arrival: float  # planned
    duration: float  # compressed, seconds
    prefill: bool = False
    created: float | None = None  # create call returned
    gated: bool = False
    ungated: float | None = None
    bound: float | None = None
    node: str = ""
    deleted: float | None = None
    affinity_node: str = ""


@dataclass
class ClaimRecord:
    """One claim's allocation (devices as (pool, device)) and when it was seen allocated and gone."""

    pod: str
    allocated: float | None = None
    devices: list[tuple[str, str]] = field(default_factory=list)
    gone: float | None = None


class Recorder:
    """Watches pods and claims of the namespace in two threads; every change lands in the records."""

    def __init__(self, api: client.ApiClient, pods: dict[str, PodRecord]) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.pods = pods
        self.claims: dict[str, ClaimRecord] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.bound_cb: Callable[[str], None] = lambda name: None
        self.threads = [
            threading.Thread(target=self._follow, args=(self._list_pods, self._pod), daemon=True),
            threading.Thread(target=self._follow, args=(self._list_claims, self._claim), daemon=True),
        ]

    def _list_pods(self, **kw: Any) -> Any:
        return self.core.list_namespaced_pod(NAMESPACE, **kw)

    def _list_claims(self, **kw: Any) -> Any:
        return self.custom.list_namespaced_custom_object("resource.k8s.io", "v1", NAMESPACE, "resourceclaims", **kw)

    def start(self) -> None:
        """Start both watches."""
        for t in self.threads:
            t.start()

    def _follow(self, lister: Callable[..., Any], handle: Callable[[str, dict[str, Any], float], None]) -> None:
        version = json.loads(lister(_preload_content=False).data)["metadata"]["resourceVersion"]
        while not self.stop.is_set():
            try:
                resp = lister(watch=True, resource_version=version, timeout_seconds=60, _preload_content=False)
                for line in kubelet_pods.stream_lines(resp):
                    ev = json.loads(line)
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        version = json.loads(lister(_preload_content=False).data)["metadata"]["resourceVersion"]
                        break
                    version = obj["metadata"].get("resourceVersion", version)
                    with self.lock:
                        handle(ev["type"], obj, time.time())
                    if self.stop.is_set():
                        break
            except Exception as exc:  # the control plane going away at the end, or a dropped watch
                if self.stop.is_set():
                    return
                print(f"watch error: {exc}; resuming", file=sys.stderr, flush=True)
                time.sleep(0.5)

    def _pod(self, kind: str, obj: dict[str, Any], now: float) -> None:
        rec = self.pods.get(obj["metadata"]["name"])
        if rec is None or kind == "DELETED":
            return
        spec = obj.get("spec") or {}
        gates = [g.get("name") for g in spec.get("schedulingGates") or []]
        if "gpuplane.dev/steer" in gates:
            rec.gated = True
        elif rec.gated and rec.ungated is None:
            rec.ungated = now
        if spec.get("nodeName") and rec.bound is None:
            rec.bound, rec.node = now, spec["nodeName"]
            self.bound_cb(obj["metadata"]["name"])
        pref = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "preferredDuringSchedulingIgnoredDuringExecution"
        ) or []
        for term in pref:
            for e in (term.get("preference") or {}).get("matchExpressions") or []:
                if e.get("key") == "kubernetes.io/hostname" and e.get("values"):
                    rec.affinity_node = e["values"][0]

    def _claim(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        owner = next((o["name"] for o in obj["metadata"].get("ownerReferences") or [] if o.get("kind") == "Pod"), "")
        rec = self.claims.setdefault(name, ClaimRecord(pod=owner))
        alloc = (obj.get("status") or {}).get("allocation")
        if kind == "DELETED" or (rec.allocated is not None and not alloc):
            if rec.allocated is not None and rec.gone is None:
                rec.gone = now
            return
        if alloc and rec.allocated is None:
            rec.allocated = now
            rec.devices = [(r["pool"], r["device"]) for r in (alloc.get("devices") or {}).get("results") or []]


def _metrics_text(url: str) -> str:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())
    return ""


def slice_writes(sim: simnodes.SimNodes) -> dict[str, dict[str, float]]:
    """Per node: gpuplane_driver_resourceslice_writes_total by verb."""
    out: dict[str, dict[str, float]] = {}
    for node in sim.started:
        text = _metrics_text(f"http://127.0.0.1:{node.metrics_port}/metrics")
        verbs: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("gpuplane_driver_resourceslice_writes_total{"):
                verb = line.split('verb="', 1)[1].split('"', 1)[0]
                verbs[verb] = float(line.rsplit(" ", 1)[1])
        out[node.name] = verbs
    return out


def apiserver_slice_requests(handle: cluster.Cluster) -> dict[str, float]:
    """apiserver_request_total for resourceslices, by verb (summed over codes and versions)."""
    out: dict[str, float] = {}
    text = handle.kubectl("get", "--raw", "/metrics", check=False, timeout=60)
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="resourceslices"' in line:
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            out[verb] = out.get(verb, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
