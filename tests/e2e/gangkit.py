"""Helpers for the template-gang e2e tests: a worker deletion LWS is sure to see, and what to print on a timeout.

:func:`held_deletion` deletes a pod while a finalizer of the test's own keeps it in the API
(terminating, ``deletionTimestamp`` set) until the caller's condition holds. LeaderWorkerSet v0.9.0
recreates a group (``RecreateGroupOnPodRestart``) only if its pod controller reads the deleted worker
while it still carries a ``deletionTimestamp``: it reconciles by name, from its cache, so when the
stand-in kubelet removes a ``terminationGracePeriodSeconds: 0`` pod at once and the worker
StatefulSet makes a pod of the same name before that reconcile runs, LWS reads the replacement and
never recreates the group (kubernetes-sigs/lws#998, fixed after v0.10.0 by #999). A real worker stays
terminating for its grace period; the hold gives LWS that window deterministically, whatever the load.

:func:`namespace_report` is everything that says why a gang's pods are not running: every pod with
its phase, gates, node and PodScheduled condition, the gang's status, every claim with its
allocation, reservations and deletion mark, and the namespace's Warning Events.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from e2e.cluster.handle import KubectlError
from tests.e2e.conftest import GpuCluster, eventually

T = TypeVar("T")
HOLD_FINALIZER = "e2e.gpuplane.dev/hold-termination"


def _finalizer_patch(pod: dict[str, Any], finalizers: list[str]) -> str:
    """A JSON patch that sets the finalizers of exactly this pod (its uid must still match)."""
    uid = pod["metadata"]["uid"]
    return json.dumps(
        [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {
                "op": "replace" if "finalizers" in pod["metadata"] else "add",
                "path": "/metadata/finalizers",
                "value": finalizers,
            },
        ]
    )


@contextlib.contextmanager
def held_deletion(gpu: GpuCluster, ns: str, pod: dict[str, Any]) -> Iterator[Callable[[], None]]:
    """Delete ``pod`` and keep it terminating until the caller calls the yielded ``release`` (or leaves)."""
    handle = gpu.cluster
    name = pod["metadata"]["name"]
    held = [*(pod["metadata"].get("finalizers") or []), HOLD_FINALIZER]
    handle.kubectl("patch", "pod", "-n", ns, name, "--type=json", "-p", _finalizer_patch(pod, held))
    handle.kubectl("delete", "pod", "-n", ns, name, "--wait=false")
    released = False

    def release() -> None:
        nonlocal released
        if released:
            return
        try:
            now = gpu.pod(ns, name)
        except KubectlError:
            released = True  # gone already
            return
        if now["metadata"]["uid"] == pod["metadata"]["uid"]:
            rest = [f for f in now["metadata"].get("finalizers") or [] if f != HOLD_FINALIZER]
            handle.kubectl("patch", "pod", "-n", ns, name, "--type=json", "-p", _finalizer_patch(now, rest))
        released = True

    try:
        yield release
    finally:
        release()


def _pod_line(pod: dict[str, Any]) -> str:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    gates = ",".join(g["name"] for g in spec.get("schedulingGates") or []) or "-"
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    claims = ",".join(s.get("resourceClaimName") or "?" for s in status.get("resourceClaimStatuses") or []) or "-"
    owner = next((f"{r['kind']}/{r['name']}" for r in meta.get("ownerReferences") or [] if r.get("controller")), "-")
    return (
        f"  pod {meta['name']} uid={meta['uid'][:8]} phase={status.get('phase')} node={spec.get('nodeName') or '-'} "
        f"gates={gates} deleting={meta.get('deletionTimestamp') or '-'} finalizers={meta.get('finalizers') or '-'} "
        f"owner={owner} claims={claims} PodScheduled={scheduled.get('status', '-')}/{scheduled.get('reason', '')}: "
        f"{scheduled.get('message', '')}"
    )


def _claim_line(claim: dict[str, Any]) -> str:
    meta, status = claim["metadata"], claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    where = ",".join(f"{r.get('pool')}/{r.get('device')}" for r in results) or "unallocated"
    reserved = ",".join(f"{r.get('name')}({str(r.get('uid'))[:8]})" for r in status.get("reservedFor") or []) or "-"
    owner = next((f"{r['kind']}/{r['name']}({r['uid'][:8]})" for r in meta.get("ownerReferences") or []), "-")
    return (
        f"  claim {meta['name']} owner={owner} allocation={where} reservedFor={reserved} "
        f"deleting={meta.get('deletionTimestamp') or '-'} finalizers={meta.get('finalizers') or '-'}"
    )


def _gang_status(gpu: GpuCluster, ns: str, gang: str) -> Any:
    return gpu.kubectl_json("get", "gpugang", "-n", ns, gang).get("status")


def namespace_report(gpu: GpuCluster, ns: str, gang: str) -> str:
    """Pods, the gang's status, claims and Warning Events of ``ns``, one line each (never raises)."""
    lines = [f"namespace {ns}:"]
    reads: list[tuple[str, Callable[[], list[str]]]] = [
        ("pods", lambda: [_pod_line(p) for p in gpu.pods(ns)]),
        (
            "gang",
            lambda: [f"  gpugang {gang} status: {json.dumps(_gang_status(gpu, ns, gang))}"],
        ),
        ("claims", lambda: [_claim_line(c) for c in gpu.kubectl_json("get", "resourceclaims", "-n", ns)["items"]]),
        (
            "events",
            lambda: [
                f"  event {e['reason']} on {e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: "
                f"{e.get('message', '')}"
                for e in gpu.kubectl_json("get", "events", "-n", ns).get("items", [])
                if e.get("type") == "Warning"
            ],
        ),
    ]
    for what, read in reads:
        try:
            lines.extend(read() or [f"  no {what}"])
        except Exception as exc:  # a report must not hide the failure it explains
            lines.append(f"  {what}: could not read ({exc})")
    return "\n".join(lines)


def eventually_explained(probe: Callable[[], T | None], timeout: float, what: str, *, report: Callable[[], str]) -> T:
    """:func:`eventually`, and on a timeout ``report()`` (e.g. :func:`namespace_report`) in the failure."""
    try:
        return eventually(probe, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{report()}") from None
