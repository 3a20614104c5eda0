"""Attacks of tests/e2e/tenant_attacks.py::ATTACKS that the API server must refuse a tenant's token outright.

Each returns the evidence (the statuses the API server answered) and raises AssertionError when a write or a
read that belongs to an administrator, the controller, the driver or another tenant was accepted.
"""

from __future__ import annotations

from kubernetes import client

from e2e.cluster import releases
from tests.e2e.tenantkit import Arena, G, V, claim, outcome


def refused(status_message: tuple[int, str], *, contains: str = "", what: str = "") -> str:
    """The evidence of a refusal; AssertionError when the API server accepted the write."""
    status, message = status_message
    assert status not in (0, 200, 201), f"{what or 'the write'} was accepted"
    assert contains in message, f"refused ({status}) but not for the expected reason: {message}"
    return f"{status}: {message[:160]}"


def _all_refused(calls: dict[str, tuple[int, str]]) -> str:
    accepted = [what for what, (status, _) in calls.items() if status == 0]
    assert not accepted, f"accepted: {accepted}"
    return "; ".join(f"{what} {status}" for what, (status, _) in calls.items())


def grant_itself(arena: Arena) -> str:
    a = arena.attacker
    pc = client.V1PriorityClass(metadata=client.V1ObjectMeta(name=f"{a.ns}-mine"), value=1_000_000_000)
    quota = client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="mine"), spec=client.V1ResourceQuotaSpec(hard={}))
    label = {"metadata": {"labels": {"gpuplane.dev/max-tier": "gold", "gpuplane.dev/steering": "enabled"}}}
    return _all_refused(
        {
            "PriorityClass": outcome(lambda: client.SchedulingV1Api(a.api).create_priority_class(pc)),
            "ResourceQuota": outcome(lambda: a.core.create_namespaced_resource_quota(a.ns, quota)),
            "label own namespace": outcome(lambda: a.core.patch_namespace(a.ns, label)),
        }
    )


# --- defects 5, 6, 8: what a tenant's token cannot write or read -------------------------------------------


def node_slice(arena: Arena) -> str:
    a = arena.attacker
    node = arena.gc.nodes[0].name
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{a.ns}-forged"},
        "spec": {
            "driver": "gpu.gpuplane.dev",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        },
    }
    return refused(
        outcome(lambda: a.custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)),
        contains="forbidden",
    )


def controller_writes(arena: Arena) -> str:
    a, victim = arena.attacker, arena.serving
    rule = {
        "apiVersion": releases.RUNNING.device_taint_rule_api,
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"{a.ns}-all"},
        "spec": {"deviceSelector": {}, "taint": {"key": "x", "effect": "NoExecute"}},
    }
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="serve", namespace=victim.ns))
    system = client.V1Eviction(metadata=client.V1ObjectMeta(name="anything", namespace="kube-system"))
    template = {**claim(victim.ns, "planted", "gpu.gpuplane.dev"), "kind": "ResourceClaimTemplate"}
    template["spec"] = {"spec": template["spec"]}
    # An IMEX plan naming the victim's claims would hand the attacker their channel (docs/imex.md): only the
    # controller writes ImexDomains, only the drivers their status; a tenant neither, not even in its own namespace.
    member = {"namespace": victim.ns, "name": "serve", "uid": "u-1", "node": "n-0"}
    gang = {"namespace": victim.ns, "name": "train", "uid": "g-1", "channel": 1, "claims": [member]}
    domain = {
        "apiVersion": "gpuplane.dev/v1alpha1",
        "kind": "ImexDomain",
        "metadata": {"name": f"{a.ns}-imex"},
        "spec": {"clique": "c.1", "nodes": ["n-0", "n-1"], "gangs": [gang]},
    }
    status = {"status": {"nodes": [{"node": "n-0", "ready": True}]}}
    return _all_refused(
        {
            "DeviceTaintRule": outcome(
                lambda: a.custom.create_cluster_custom_object(*rule["apiVersion"].split("/"), "devicetaintrules", rule)
            ),
            "evict victim": outcome(lambda: a.core.create_namespaced_pod_eviction("serve", victim.ns, eviction)),
            "evict kube-system": outcome(
                lambda: a.core.create_namespaced_pod_eviction("anything", "kube-system", system)
            ),
            "template elsewhere": a.create(template),
            "ImexDomain in gpuplane-system": outcome(
                lambda: a.custom.create_namespaced_custom_object(
                    "gpuplane.dev", "v1alpha1", "gpuplane-system", "imexdomains", domain
                )
            ),
            "ImexDomain in its own namespace": outcome(
                lambda: a.custom.create_namespaced_custom_object(
                    "gpuplane.dev", "v1alpha1", a.ns, "imexdomains", domain
                )
            ),
            "ImexDomain status": outcome(
                lambda: a.custom.patch_namespaced_custom_object_status(
                    "gpuplane.dev", "v1alpha1", "gpuplane-system", "imexdomains", "imex-any", status
                )
            ),
            "label victim pod": outcome(
                lambda: a.core.patch_namespaced_pod(
                    "serve", victim.ns, {"metadata": {"labels": {"gpuplane.dev/gang": "train"}}}
                )
            ),
        }
    )


def status_writes(arena: Arena) -> str:
    a, victim = arena.attacker, arena.gangs
    running = {"status": {"phase": "Running"}}
    preempted = {"status": {"phase": "Preempted"}}
    return _all_refused(
        {
            "own gang status": outcome(
                lambda: a.custom.patch_namespaced_custom_object_status(G, V, a.ns, "gpugangs", "train", running)
            ),
            "victim gang status": outcome(
                lambda: a.custom.patch_namespaced_custom_object_status(G, V, victim.ns, "gpugangs", "train", preempted)
            ),
            "victim gang spec": outcome(
                lambda: a.custom.patch_namespaced_custom_object(G, V, victim.ns, "gpugangs", "train", {"spec": {}})
            ),
        }
    )


def read_others(arena: Arena) -> str:
    a = arena.attacker
    calls: dict[str, tuple[int, str]] = {}
    for v in arena.victims:
        calls[f"{v.role} pods"] = outcome(lambda v=v: a.core.list_namespaced_pod(v.ns))  # type: ignore[misc]
        calls[f"{v.role} claims"] = outcome(
            lambda v=v: a.custom.list_namespaced_custom_object("resource.k8s.io", "v1", v.ns, "resourceclaims")  # type: ignore[misc]
        )
        calls[f"{v.role} gangs"] = outcome(lambda v=v: a.custom.list_namespaced_custom_object(G, V, v.ns, "gpugangs"))  # type: ignore[misc]
    calls["gpuplane-system pods"] = outcome(lambda: a.core.list_namespaced_pod("gpuplane-system"))
    calls["all claims"] = outcome(
        lambda: a.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims")
    )
    return _all_refused(calls)


def scrape_metrics(arena: Arena) -> str:
    """The metrics servers allow a token whose SubjectAccessReview for ``get /metrics`` is allowed; the
    session's simulated components serve plain loopback HTTP, so the attacker asks the same question the
    servers ask (tests/e2e/test_metrics_auth.py scrapes the authenticated servers themselves: 403)."""
    a = arena.attacker
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            non_resource_attributes=client.V1NonResourceAttributes(path="/metrics", verb="get")
        )
    )
    answer = client.AuthorizationV1Api(a.api).create_self_subject_access_review(review)
    allowed = bool(answer.status and answer.status.allowed)
    assert not allowed, "the attacker's token may get /metrics"
    return "SubjectAccessReview get /metrics: denied (the servers answer 403)"
