"""The multi-tenant adversarial e2e's kit (issue 32): tenants, their workloads, a snapshot, the invariants.

A tenant is what an administrator makes of a team: a namespace, a ServiceAccount bound to the built-in
``edit`` ClusterRole there and nowhere else, and a real token (TokenRequest) in a kubeconfig. Every action
of a tenant goes through its own :class:`Tenant` client; the administrator's client (``gc.cluster``) only
sets up what an administrator grants (namespace labels, a PriorityClass) and reads the evidence.

The attacks live in one list, ``tests/e2e/tenant_attacks.py``; this module holds what they share.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import procs
from e2e.plane import components, identity
from tests.e2e.conftest import GpuCluster, eventually

G, V = "gpuplane.dev", "v1alpha1"
STEER_GATE, GANG_GATE = "gpuplane.dev/steer", "gpuplane.dev/gang"
STEERED = "gpuplane.dev/steered"
STEER_TIMEOUT_S = 30.0  # gpuplane.controller.steer.decide.Settings.timeout_s: a gated pod waits no longer
GB200 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"'
PAUSE = "registry.k8s.io/pause:3.10"
HARM_REASONS = ("Preempt", "Evict", "Killing", "Moved", "Rebalanc")  # Event reasons that mean a victim was touched


def outcome(call: Callable[[], object]) -> tuple[int, str]:
    """Run one API call; (0, "allowed") when the API server accepted it, else (HTTP status, its message)."""
    try:
        call()
    except ApiException as exc:
        try:
            message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
        except ValueError:
            message = str(exc.reason)
        return int(exc.status or 0), message
    return 0, "allowed"


@dataclasses.dataclass
class Tenant:
    """One tenant: its namespace and an API client with its own ServiceAccount token (edit there only)."""

    role: str
    ns: str
    api: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def user(self) -> str:
        return identity.username(self.ns, "tenant")

    def create(self, body: dict[str, Any]) -> tuple[int, str]:
        """Create one object of kind Pod, ResourceClaim(Template), GpuGang, GpuRequest or PodDisruptionBudget."""
        ns = body["metadata"].get("namespace", self.ns)
        kind = body["kind"]
        if kind == "Pod":
            return outcome(lambda: self.core.create_namespaced_pod(ns, cast(Any, body)))
        if kind == "PodDisruptionBudget":
            policy = client.PolicyV1Api(self.api)
            return outcome(lambda: policy.create_namespaced_pod_disruption_budget(ns, cast(Any, body)))
        group, version = body["apiVersion"].split("/")
        plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}.get(
            kind, kind.lower() + "s"
        )
        return outcome(lambda: self.custom.create_namespaced_custom_object(group, version, ns, plural, body))

    def must_create(self, body: dict[str, Any]) -> None:
        status, message = self.create(body)
        assert status == 0, f"{self.role} could not create its own {body['kind']}: {status} {message}"


@dataclasses.dataclass
class Arena:
    """The cluster, the attacker and its two victims (a gang tenant and a serving tenant, steering enabled)."""

    gc: GpuCluster
    attacker: Tenant
    gangs: Tenant
    serving: Tenant

    @property
    def victims(self) -> tuple[Tenant, Tenant]:
        return self.gangs, self.serving


def _bind_edit(api: client.ApiClient, ns: str) -> None:
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="tenant-edit"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="tenant", namespace=ns)],
        ),
    )


def make_tenant(gc: GpuCluster, role: str, ns: str, labels: dict[str, str], out: Path) -> Tenant:
    """The administrator's side: the namespace with the labels it grants, the ServiceAccount, edit, a token."""
    api = gc.cluster.api
    meta = client.V1ObjectMeta(name=ns, labels=labels)
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=meta))
    identity.ensure_service_account(api, ns, "tenant")
    identity.wait_service_account(api, ns, "tenant")
    _bind_edit(api, ns)
    token = identity.request_token(api, ns, "tenant")
    kubeconfig = identity.write_token_kubeconfig(
        out / f"{role}.kubeconfig", gc.cluster.kubeconfig, token, identity.username(ns, "tenant")
    )
    return Tenant(role, ns, identity.new_client(kubeconfig))


# --- workloads ---------------------------------------------------------------------------------------------


def claim(ns: str, name: str, device_class: str, share: int | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if share is not None:
        exactly["capacity"] = {"requests": {"sharePercent": str(share)}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def whole_gpu_template(ns: str) -> dict[str, Any]:
    body = claim(ns, "whole", "gpu.gpuplane.dev")
    return {**body, "kind": "ResourceClaimTemplate", "spec": {"spec": body["spec"]}}


def pod(
    ns: str, name: str, *, claim_name: str = "", template: str = "", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    ref: dict[str, str] = {"name": "gpu"}
    if template:
        ref["resourceClaimTemplateName"] = template
    else:
        ref["resourceClaimName"] = claim_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [ref],
            "containers": [{"name": "c", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def gang(ns: str, name: str, *, spec_priority: int | None = None) -> list[dict[str, Any]]:
    """A GpuGang filling the GB200 clique (2 members x 4 GPUs, TP 8) and its two gated member pods."""
    spec: dict[str, Any] = {"members": 2, "gpusPerMember": 4, "tensorParallelSize": 8, "selectors": [GB200]}
    if spec_priority is not None:
        spec["priority"] = spec_priority
    items = [{"apiVersion": f"{G}/{V}", "kind": "GpuGang", "metadata": {"name": name, "namespace": ns}, "spec": spec}]
    for i in range(2):
        member = pod(ns, f"{name}-pod-{i}", claim_name=f"{name}-{i}", labels={"gpuplane.dev/gang": name})
        member["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
        items.append(member)
    return items


def gang_status(gc: GpuCluster, ns: str, name: str) -> dict[str, Any]:
    return dict(gc.kubectl_json("get", "gpugang", "-n", ns, name).get("status") or {})


# --- evidence ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What a victim tenant has: each pod's (uid, node, restarts, phase), each claim's (uid, devices)."""

    pods: dict[str, tuple[str, str, int, str]]
    claims: dict[str, tuple[str, tuple[str, ...]]]


def snapshot(gc: GpuCluster, ns: str) -> Snapshot:
    pods = {}
    for p in gc.kubectl_json("get", "pods", "-n", ns)["items"]:
        restarts = sum(int(c.get("restartCount", 0)) for c in (p.get("status") or {}).get("containerStatuses") or [])
        gone = " (deleting)" if p["metadata"].get("deletionTimestamp") else ""
        phase = str((p.get("status") or {}).get("phase")) + gone
        pods[p["metadata"]["name"]] = (p["metadata"]["uid"], str(p["spec"].get("nodeName")), restarts, phase)
    claims = {}
    for c in gc.kubectl_json("get", "resourceclaims", "-n", ns)["items"]:
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        devices = tuple(sorted(f"{r['pool']}/{r['device']}" for r in results))
        claims[c["metadata"]["name"]] = (c["metadata"]["uid"], devices)
    return Snapshot(pods, claims)


def harm_events(gc: GpuCluster, ns: str) -> list[str]:
    """Events in a victim's namespace whose reason says something of it was preempted, evicted or moved."""
    return [
        f"{e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: {e['reason']}: {e.get('message', '')}"
        for e in gc.kubectl_json("get", "events", "-n", ns)["items"]
        if any(r in str(e.get("reason", "")) for r in HARM_REASONS)
    ]


def controller_rss_kib(gc: GpuCluster) -> dict[str, int]:
    """Resident memory of each live controller replica (KiB), from /proc."""
    assert gc.cluster.state_dir is not None
    out = {}
    for name, record in components.controller_records(gc.cluster.state_dir.resolve()).items():
        if not procs.is_alive(record):
            continue
        for line in Path(f"/proc/{record.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out[name] = int(line.split()[1])
    return out


def wait_running(gc: GpuCluster, ns: str, names: list[str], timeout: float) -> None:
    def probe() -> bool:
        phases = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in gc.pods(ns)}
        return all(phases.get(n) == "Running" for n in names)

    eventually(probe, timeout, f"{names} running in {ns}")


def steered_in_time(gc: GpuCluster, tenant: Tenant, name: str) -> str:
    """The serving tenant makes one more whole-GPU pod; it must be steered by the controller and run before the
    steering timeout. Returns the evidence; raises AssertionError when it was held back."""
    started = time.monotonic()
    tenant.must_create(pod(tenant.ns, name, template="whole"))
    deadline = started + STEER_TIMEOUT_S + 60

    def running() -> dict[str, Any] | None:
        got = gc.pod(tenant.ns, name)
        return got if (got.get("status") or {}).get("phase") == "Running" else None

    got = eventually(running, deadline - time.monotonic(), f"{tenant.ns}/{name} running")
    waited = time.monotonic() - started
    steered = (got["metadata"].get("annotations") or {}).get(STEERED, "")
    assert steered, f"{tenant.ns}/{name} ran after {waited:.0f} s, released unsteered (the controller found no room)"
    assert waited < STEER_TIMEOUT_S, (
        f"{tenant.ns}/{name} waited {waited:.0f} s (steering timeout {STEER_TIMEOUT_S:.0f} s)"
    )
    return f"{tenant.ns}/{name} steered to {steered.split(';')[0]} and running after {waited:.1f} s"


def delete_namespaces(gc: GpuCluster, names: Iterator[str] | list[str]) -> None:
    for ns in names:
        gc.cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")
    for ns in names:
        gc.cluster.kubectl("wait", "--for=delete", f"namespace/{ns}", "--timeout=150s", timeout=180, check=False)
