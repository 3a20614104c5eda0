"""Fleet benchmark, measurement 1: kube-scheduler throughput and latency for pods with and without GPU claims.

One round = ``n`` pods of one kind, created by ``workers`` threads as fast as the API server
takes them; every pod of a claim kind references its own ResourceClaim, created before the round
(not timed), so what is timed is the scheduler: its queue, its DRA allocator over every published
device, the claim's allocation write and the binding. Per round:

* per pod, creation -> bound: from the watch event that shows the pod to the one that shows its
  ``spec.nodeName`` (arrival times in this process, one watch for the round);
* throughput: pods / (first pod seen -> last pod bound), and how long the creates themselves took
  (when creation is the slower side, throughput says so rather than hiding it);
* kube-scheduler's CPU seconds over the round, per pod bound (``/proc``: less sensitive to what
  else runs on the machine than any wall-clock figure);
* kube-scheduler's own histograms over the round (``/metrics`` before and after):
  ``scheduler_scheduling_attempt_duration_seconds{result="scheduled"}`` (one scheduling cycle:
  filter, score, reserve), ``scheduler_pod_scheduling_sli_duration_seconds`` (queue entry to bound)
  and the mean of the extension points where DRA works (PreFilter, Filter, Reserve, PreBind).

The round then deletes its pods and claims and waits until they are gone.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client

from bench.dra import dra_overhead, dra_setup, dra_watch
from bench.fleet import fleet_probe
from e2e.plane import fleet
from gpuplane.api import mig_offer, names

Printer = Callable[[str], None]

NAMESPACE = "fleet-bench"
GROUP, VERSION = "resource.k8s.io", "v1"
H100 = "NVIDIA H100 80GB HBM3"
KINDS = ("none", "mig-1g", "mig-1g-sel", "gpu-1", "gpu-4")
MIG_KINDS = ("mig-1g", "mig-1g-sel")
KIND_TEXT = {
    "none": "no claim",
    "mig-1g": "one MIG 1g.10gb",
    "mig-1g-sel": "one MIG 1g.10gb, nodeSelector mig-offered",
    "gpu-1": "one whole GPU",
    "gpu-4": "4 GPUs, matchAttribute nvlinkDomain",
    "gpu-share": "25 % of a GPU, time-sliced",
}
SHARE_PERCENT = 25
TIME_SLICING = {
    "opaque": {
        "driver": names.DRIVER_NAME,
        "parameters": {
            "apiVersion": "gpu.gpuplane.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}},
        },
    }
}
SCHED_POINTS = ("PreFilter", "Filter", "Reserve", "PreBind")


def claim_body(kind: str, name: str, *, h100_only: bool = False, label: str = "") -> dict[str, Any]:
    """The ResourceClaim one pod of ``kind`` uses."""
    selectors: list[dict[str, Any]] = []
    if kind in MIG_KINDS:
        exactly: dict[str, Any] = {"deviceClassName": "mig.gpuplane.dev"}
        selectors.append({"cel": {"expression": f'device.attributes["{names.DRIVER_NAME}"].migProfile == "1g.10gb"'}})
    else:
        exactly = {
            "deviceClassName": "gpu.gpuplane.dev",
            "allocationMode": "ExactCount",
            "count": 4 if kind == "gpu-4" else 1,
        }
        if h100_only:
            selectors.append(
                {"cel": {"expression": f'device.attributes["{names.DRIVER_NAME}"].productName == "{H100}"'}}
            )
    if kind == "gpu-share":
        exactly["capacity"] = {"requests": {"sharePercent": str(SHARE_PERCENT)}}
    if selectors:
        exactly["selectors"] = selectors
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": exactly}]}
    if kind == "gpu-share":
        devices["config"] = [TIME_SLICING]
    if kind == "gpu-4":
        devices["constraints"] = [{"requests": ["gpus"], "matchAttribute": f"{names.DRIVER_NAME}/nvlinkDomain"}]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench-round": label}},
        "spec": {"devices": devices},
    }


def create_claims(
    api: client.ApiClient,
    kind: str,
    names_: Sequence[str],
    label: str,
    *,
    what: str,
    h100_only: bool = False,
    workers: int = 8,
    out: Printer = print,
) -> None:
    """One ResourceClaim of ``kind`` per name (``claim_body``), created on ``workers`` threads."""
    custom = client.CustomObjectsApi(api)
    fleet.parallel(
        [claim_body(kind, n, h100_only=h100_only, label=label) for n in names_],
        lambda body: custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "resourceclaims", body),
        what=what,
        workers=workers,
        out=out,
    )


def pod_body(kind: str, name: str, label: str) -> dict[str, Any]:
    """One benchmark pod (its claim, if any, is called like the pod)."""
    container: dict[str, Any] = {
        "name": "c",
        "image": dra_setup.PAUSE,
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
    }
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if kind != "none":
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": name}]
        container["resources"]["claims"] = [{"name": "gpus"}]
    if kind == "mig-1g-sel":  # only the nodes the controller labels for the MIG offer (docs/mig-offer.md)
        spec["nodeSelector"] = {mig_offer.NODE_LABEL: mig_offer.NODE_LABEL_VALUE}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench-round": label}},
        "spec": spec,
    }


class BindWatch(dra_watch._Watch):
    """When each pod of a round is first seen, first seen bound, first seen Running (monotonic clock)."""

    def __init__(self, api: client.ApiClient, label: str) -> None:
        core = client.CoreV1Api(api)
        selector = f"bench-round={label}"
        super().__init__(lambda **kw: core.list_namespaced_pod(NAMESPACE, label_selector=selector, **kw))
        self.seen: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.gone: set[str] = set()

    def _event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.gone.add(name)
            return
        self.seen.setdefault(name, now)
        if (obj.get("spec") or {}).get("nodeName"):
            self.bound.setdefault(name, now)
        if (obj.get("status") or {}).get("phase") == "Running":
            self.running.setdefault(name, now)


@dataclasses.dataclass(frozen=True)
class Round:
    """One measured round."""

    fleet: str  # "a" gpuplane's slices as published, "a+" the same on --newer-scheduler, "b" whole GPUs only,
    # "a0" the layout before counter sets were packed, "c" (pods without claims)
    kind: str
    pods: int
    bound: int
    latency: Mapping[str, float]  # p50/p99/max/mean seconds, creation -> bound
    create_s: float  # first create sent -> last create answered
    span_s: float  # first pod seen -> last pod bound
    attempt_ms: Mapping[str, float | None]  # scheduler: p50/p99/mean of a scheduling cycle
    sli_ms: Mapping[str, float | None]  # scheduler: p50/p99 queue -> bound
    points_ms: Mapping[str, float | None]  # scheduler: mean per extension point per cycle
    attempts: float  # scheduling cycles the scheduler ran for the round's pods
    unschedulable: float
    sched_cpu_s: float = 0.0  # kube-scheduler's CPU seconds from the first create to the last bind

    @property
    def throughput(self) -> float:
        """Pods bound per second."""
        return self.bound / self.span_s if self.span_s > 0 else 0.0


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def scheduler_figures(delta: fleet_probe.Metrics) -> dict[str, Any]:
    """The scheduler's histograms over one round."""
    attempt = "scheduler_scheduling_attempt_duration_seconds"
    sli = "scheduler_pod_scheduling_sli_duration_seconds"
    points = "scheduler_framework_extension_point_duration_seconds"
    return {
        "attempt_ms": {
            "p50": _ms(delta.histogram_quantile(attempt, 0.5, result="scheduled")),
            "p99": _ms(delta.histogram_quantile(attempt, 0.99, result="scheduled")),
            "mean": _ms(delta.histogram_mean(attempt, result="scheduled")),
        },
        "sli_ms": {
            "p50": _ms(delta.histogram_quantile(sli, 0.5)),
            "p99": _ms(delta.histogram_quantile(sli, 0.99)),
        },
        "points_ms": {p: _ms(delta.histogram_mean(points, extension_point=p)) for p in SCHED_POINTS},
        "attempts": delta.histogram_count(attempt),
        "unschedulable": delta.histogram_count(attempt, result="unschedulable"),
    }


def _create_all(
    items: Sequence[tuple[str, dict[str, Any]]], create: Callable[[dict[str, Any]], Any], workers: int
) -> float:
    """Create every body on ``workers`` threads; return first-send -> last-answer seconds."""
    lock = threading.Lock()
    queue = list(items)
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not queue or errors:
                    return
                _, body = queue.pop(0)
            try:
                create(body)
            except BaseException as err:  # reported once all threads stop
                with lock:
                    errors.append(err)
                return

    started = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.monotonic() - started


def wait_namespace_empty(api: client.ApiClient, label: str, timeout: float) -> None:
    """Wait until the round's pods and claims are gone."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    selector = f"bench-round={label}"

    def empty() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector, limit=1).items
        claims: dict[str, Any] = custom.list_namespaced_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, NAMESPACE, "resourceclaims", label_selector=selector, limit=1
        )
        return not pods and not claims.get("items")

    dra_watch.wait(empty, timeout, f"pods and claims of round {label} deleted")


def delete_round(api: client.ApiClient, label: str, timeout: float) -> None:
    """Delete a round's pods, then its claims, and wait until both are gone."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    selector = f"bench-round={label}"
    core.delete_collection_namespaced_pod(NAMESPACE, label_selector=selector, grace_period_seconds=0)
    custom.delete_collection_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, "resourceclaims", label_selector=selector
    )
    wait_namespace_empty(api, label, timeout)


def run_round(
    api: client.ApiClient,
    probe: fleet_probe.Probe,
    *,
    fleet_variant: str,
    kind: str,
    pods: int,
    label: str,
    timeout: float,
    workers: int = 8,
    h100_only: bool = False,
    keep: bool = False,
    out: Printer = print,
) -> Round:
    """Measure one round (see the module docstring); ``keep`` leaves its pods and claims in place."""
    core = client.CoreV1Api(api)
    names_ = [f"{label}-{i:05d}" for i in range(pods)]
    if kind != "none":
        create_claims(
            api,
            kind,
            names_,
            label,
            what=f"{label}: claims created (not timed)",
            h100_only=h100_only,
            workers=workers,
            out=out,
        )
    watch = BindWatch(api, label)
    watch.start()
    sched_pid = probe.pids().get("kube-scheduler", 0)
    before = probe.scheduler()
    cpu_before = fleet_probe.cpu_s(sched_pid)
    bodies = [(n, pod_body(kind, n, label)) for n in names_]
    create_s = _create_all(bodies, lambda body: core.create_namespaced_pod(NAMESPACE, body), workers)  # type: ignore[arg-type]
    try:
        dra_watch.wait(lambda: len(watch.bound) == pods, timeout, f"{pods} pods of {label} bound")
    except TimeoutError:
        out(f"  {label}: only {len(watch.bound)}/{pods} pods bound after {timeout:.0f}s")
    cpu_after = fleet_probe.cpu_s(sched_pid)
    after = probe.scheduler()
    watch.stop()
    figures = scheduler_figures(after.minus(before))
    latencies = [watch.bound[n] - watch.seen[n] for n in names_ if n in watch.bound and n in watch.seen]
    first = min(watch.seen.values()) if watch.seen else 0.0
    span = (max(watch.bound.values()) - first) if watch.bound else 0.0
    result = Round(
        fleet=fleet_variant,
        kind=kind,
        pods=pods,
        bound=len(watch.bound),
        latency=dra_overhead.summary(latencies) if latencies else {"p50": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0},
        create_s=create_s,
        span_s=span,
        sched_cpu_s=cpu_after - cpu_before,
        **figures,
    )
    out(
        f"  {label}: {result.bound}/{pods} bound in {span:.1f}s ({result.throughput:.3g} pods/s; creates took "
        f"{create_s:.1f}s), creation->bound p50 {result.latency['p50']:.2f}s p99 {result.latency['p99']:.2f}s"
    )
    if not keep:
        delete_round(api, label, timeout)
    return result


def ensure_namespace(api: client.ApiClient) -> None:
    """The benchmark namespace and its default ServiceAccount (pods need it)."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    except client.ApiException as err:
        if err.status != 409:
            raise
    dra_watch.wait(
        lambda: bool(core.list_namespaced_service_account(NAMESPACE, field_selector="metadata.name=default").items),
        60,
        "the default ServiceAccount",
    )
