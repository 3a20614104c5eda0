"""The controller's API writes: one client built once, plain dicts, idempotent by construction.

Every write tolerates having been done already (create -> 409 is fine when the
object is ours, delete -> 404 is fine), because a reconcile may be repeated
after a crash at any point. Reads come from kopf's indexes, not from here.

Every write is fenced: it first asks the ``guard`` (the leader elector) and
raises :class:`NotLeader` instead of writing when this replica does not hold
the leader Lease within its renew deadline, so a replica that lost
leadership mid-reconcile stops at the next write.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from typing import Any, cast

import structlog
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpuplane.api import kuberesponse
from gpuplane.controller import events, names, steps

log = structlog.get_logger(__name__)

RESOURCE_GROUP = "resource.k8s.io"
RULES = "devicetaintrules"
TAINT_RULE_VERSIONS = ("v1", "v1beta2")  # GA in 1.37; beta (off by default) in 1.36
RESOURCE_VERSION = "v1"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
SUSPENDABLE = {  # step kind -> (group, version, plural) of an owner whose spec.suspend stops its pods
    "suspend-job": ("batch", "v1", "jobs"),
    "suspend-jobset": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
}


def make_api_client(kubeconfig: str | None) -> client.ApiClient:
    """One API client for the process (kubeconfig file, else in-cluster service account)."""
    if kubeconfig:
        load: Callable[..., client.ApiClient] = config.new_client_from_config
        return load(config_file=kubeconfig)
    incluster: Callable[[], None] = config.load_incluster_config
    incluster()
    return client.ApiClient()


class StepFailed(RuntimeError):
    """A write of an apply sequence failed; later steps were not run."""


class NotLeader(StepFailed):
    """This replica is not the leader (any more): the write was not made."""


def _always() -> bool:
    return True


class KubeWriter:
    """The writes the reconcilers make, plus the Event recorder; each write fenced by ``guard``."""

    def __init__(
        self, api_client: client.ApiClient, component: str = names.COMPONENT, *, guard: Callable[[], bool] = _always
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.component = component
        self.guard = guard
        self.rules_version: str | None = None  # the DeviceTaintRule version served, once listed

    def fence(self) -> None:
        """Raise NotLeader unless this replica may write now."""
        if not self.guard():
            raise NotLeader("not the leader: write skipped")

    # --- gangs ------------------------------------------------------------------------------
    def patch_gang_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch the status subresource (no resourceVersion: cannot conflict)."""
        self.fence()
        kuberesponse.discard(
            self.custom.patch_namespaced_custom_object_status(
                names.GROUP,
                names.VERSION,
                namespace,
                names.GANG_PLURAL,
                name,
                {"status": dict(patch)},
                _content_type=MERGE,
                _preload_content=False,
            )
        )

    # --- steps ------------------------------------------------------------------------------
    def run(self, namespace: str, step: steps.Step) -> None:
        """Execute one step; raise StepFailed on an error that is not 'already done'."""
        if step.kind != "wait":
            self.fence()
        try:
            if step.kind == "create-claim":
                written = self.custom.create_namespaced_custom_object(
                    RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", step.body, _preload_content=False
                )
            elif step.kind == "delete-claim":
                written = self.custom.delete_namespaced_custom_object(
                    RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", step.name, _preload_content=False
                )
            elif step.kind == "patch-pod":
                written = self.core.patch_namespaced_pod(
                    step.name, namespace, step.body, _content_type=JSON_PATCH, _preload_content=False
                )
            elif step.kind == "delete-pod":
                written = self.core.delete_namespaced_pod(
                    step.name, namespace, grace_period_seconds=step.body, _preload_content=False
                )
            elif step.kind == "evict-pod":
                written = self._evict(namespace, step)
            elif step.kind in SUSPENDABLE:
                group, version, plural = SUSPENDABLE[step.kind]
                written = self.custom.patch_namespaced_custom_object(
                    group,
                    version,
                    namespace,
                    plural,
                    step.name,
                    {"spec": {"suspend": True}},
                    _content_type=MERGE,
                    _preload_content=False,
                )
            elif step.kind == "wait":
                raise StepFailed(step.why)
            else:  # pragma: no cover - kinds are a closed set
                raise StepFailed(f"unknown step kind {step.kind}")
            kuberesponse.discard(written)  # never decoded: a user's object may nest without bound
        except ApiException as exc:
            if step.kind == "create-claim" and exc.status == 409:
                return  # created by an earlier attempt; the next plan checks its decision annotation
            if step.kind.startswith(("delete-", "suspend-")) and exc.status == 404:
                return  # gone already: nothing left to delete or to stop
            if step.kind == "evict-pod" and exc.status in (404, 409):
                return  # gone, or replaced by another pod of the name (uid precondition): not the one meant
            if step.kind == "evict-pod" and exc.status == 429:
                raise StepFailed(f"evict-pod {namespace}/{step.name} refused: {api_message(exc)}") from exc
            raise StepFailed(f"{step.kind} {namespace}/{step.name}: {exc.status} {exc.reason}") from exc

    def _evict(self, namespace: str, step: steps.Step) -> Any:
        """A gang preemption's eviction (Eviction API, PDBs apply), only of the pod with the step's uid."""
        ev = step.body
        if not isinstance(ev, steps.Eviction) or not ev.uid:
            raise StepFailed(f"evict-pod {namespace}/{step.name}: no uid to pin the eviction to")
        options = client.V1DeleteOptions(
            grace_period_seconds=ev.grace_seconds,
            preconditions=client.V1Preconditions(uid=ev.uid) if ev.uid else None,
        )
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=step.name, namespace=namespace), delete_options=options
        )
        extra: dict[str, Any] = {"dry_run": "All"} if ev.dry_run else {}
        return self.core.create_namespaced_pod_eviction(step.name, namespace, body, _preload_content=False, **extra)

    # --- right-sizing: GpuRequests and their ResourceClaimTemplates -------------------------------
    def create_claim_template(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a ResourceClaimTemplate; 409 (made by an earlier pass) is done."""
        self.fence()
        try:
            self.custom.create_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", dict(body)
            )
        except ApiException as exc:
            if exc.status != 409:
                raise

    def delete_claim_template(self, namespace: str, name: str) -> None:
        """Delete a ResourceClaimTemplate; 404 is done."""
        self.fence()
        try:
            self.custom.delete_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def patch_gpu_request_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a GpuRequest's status subresource."""
        self.fence()
        self.custom.patch_namespaced_custom_object_status(
            names.GROUP, names.VERSION, namespace, "gpurequests", name, {"status": dict(status)}, _content_type=MERGE
        )

    # --- steering: the namespaces an administrator opted in ---------------------------------------
    def namespaces_labelled(self, selector: str) -> frozenset[str]:
        """Names of the namespaces matching a label selector (a read: not fenced)."""
        got = self.core.list_namespace(label_selector=selector, _request_timeout=30)
        return frozenset(str(n.metadata.name) for n in got.items if n.metadata is not None)

    # --- rebalancing: pods, evictions, DeviceTaintRules -------------------------------------------
    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod as a plain dict (camelCase keys), or None when it is gone."""
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], self.core.api_client.sanitize_for_serialization(pod))

    def list_pods(self, namespace: str) -> list[dict[str, Any]]:
        """The pods of a namespace as plain dicts."""
        pods = self.core.list_namespaced_pod(namespace)
        return [cast(dict[str, Any], self.core.api_client.sanitize_for_serialization(p)) for p in pods.items]

    def evict_pod(self, namespace: str, name: str, uid: str) -> str | None:
        """Evict the pod of that uid through the Eviction API (PodDisruptionBudgets apply).

        None when done, else why not (429: a budget; 409: the name is another pod's now, by the uid
        precondition; 404: gone).
        """
        self.fence()
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace), delete_options=options)
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, body)
        except ApiException as exc:
            if exc.status == 429:
                return api_message(exc)
            if exc.status == 404:
                return "the pod is gone"
            if exc.status == 409:
                return f"pod {namespace}/{name} is no longer the pod of uid {uid} (uid precondition)"
            raise
        return None

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        """Every namespace's labels (a read: not fenced), for the tier entitlements."""
        got = self.core.list_namespace(_request_timeout=30)
        return {str(n.metadata.name): dict(n.metadata.labels or {}) for n in got.items if n.metadata is not None}

    def list_device_taint_rules(self, label: str) -> list[dict[str, Any]] | None:
        """DeviceTaintRules with a label, at the newest version served (resource.k8s.io/v1 from 1.37,
        v1beta2 on 1.36, remembered); None when neither is served (DRADeviceTaintRules off)."""
        for version in TAINT_RULE_VERSIONS if self.rules_version is None else (self.rules_version,):
            try:
                out = self.custom.list_cluster_custom_object(
                    RESOURCE_GROUP, version, RULES, label_selector=f"{label}=true"
                )
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            self.rules_version = version
            return list(cast(dict[str, Any], out).get("items") or [])
        return None

    def create_device_taint_rule(self, body: Mapping[str, Any]) -> None:
        """Create a DeviceTaintRule at the version listed (raises ApiException: 404 when the API is not served)."""
        self.fence()
        version = self.rules_version or TAINT_RULE_VERSIONS[0]
        body = {**body, "apiVersion": f"{RESOURCE_GROUP}/{version}"}
        self.custom.create_cluster_custom_object(RESOURCE_GROUP, version, RULES, body)

    def delete_device_taint_rule(self, name: str) -> None:
        """Delete a DeviceTaintRule; 404 is done."""
        self.fence()
        try:
            self.custom.delete_cluster_custom_object(RESOURCE_GROUP, self.rules_version or "v1", RULES, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def annotate_device_taint_rule(self, name: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch annotations onto a DeviceTaintRule."""
        self.fence()
        patch = {"metadata": {"annotations": dict(annotations)}}
        version = self.rules_version or TAINT_RULE_VERSIONS[0]
        self.custom.patch_cluster_custom_object(RESOURCE_GROUP, version, RULES, name, patch, _content_type=MERGE)

    # --- claims and nodes ------------------------------------------------------------------------
    def annotate_claim(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations onto a ResourceClaim (None removes one)."""
        self.fence()
        kuberesponse.discard(
            self.custom.patch_namespaced_custom_object(
                RESOURCE_GROUP,
                RESOURCE_VERSION,
                namespace,
                "resourceclaims",
                name,
                {"metadata": {"annotations": dict(annotations)}},
                _content_type=MERGE,
                _preload_content=False,
            )
        )

    def set_pod_condition(self, namespace: str, name: str, cond: Mapping[str, Any]) -> None:
        """Strategic-merge one pod condition (conditions merge by type)."""
        self.fence()
        kuberesponse.discard(
            self.core.patch_namespaced_pod_status(
                name, namespace, {"status": {"conditions": [dict(cond)]}}, _preload_content=False
            )
        )

    def fail_pending_pod(self, namespace: str, name: str, reason: str, message: str) -> bool:
        """Set a Pending pod's phase to Failed; False when it is gone or no longer Pending (nothing written)."""
        self.fence()
        patch = [
            {"op": "test", "path": "/status/phase", "value": "Pending"},
            {"op": "replace", "path": "/status/phase", "value": "Failed"},
            {"op": "add", "path": "/status/reason", "value": reason},
            {"op": "add", "path": "/status/message", "value": message},
        ]
        try:
            kuberesponse.discard(
                self.core.patch_namespaced_pod_status(
                    name, namespace, patch, _content_type=JSON_PATCH, _preload_content=False
                )
            )
        except ApiException as exc:
            if exc.status in (404, 409, 422):  # gone, or the phase test failed: not Pending any more
                return False
            raise
        return True

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch a Node's metadata."""
        self.fence()
        kuberesponse.discard(self.core.patch_node(name, dict(patch), _content_type=MERGE, _preload_content=False))

    # --- events (the Recorder protocol) -----------------------------------------------------------
    def event(self, ref: events.ObjectRef, kind: events.EventType, reason: str, message: str) -> None:
        """Record or bump an Event; never raises (and records nothing when not the leader)."""
        if not self.guard():
            return
        namespace = ref.namespace or "default"
        name = events.event_name(ref, reason, message)
        now = datetime.datetime.now(datetime.UTC)
        try:
            try:
                current = self.core.read_namespaced_event(name, namespace)
                self.core.patch_namespaced_event(
                    name,
                    namespace,
                    {"count": int(current.count or 1) + 1, "lastTimestamp": _ts(now)},
                    _content_type=MERGE,
                )
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            body = client.CoreV1Event(
                metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                involved_object=client.V1ObjectReference(
                    api_version=ref.api_version,
                    kind=ref.kind,
                    name=ref.name,
                    namespace=ref.namespace or None,
                    uid=ref.uid,
                ),
                reason=reason,
                message=message[:1024],
                type=kind,
                first_timestamp=now,
                last_timestamp=now,
                count=1,
                source=client.V1EventSource(component=self.component),
                reporting_component=self.component,
            )
            try:
                self.core.create_namespaced_event(namespace, body)
            except ApiException as exc:
                if exc.status != 409:  # a concurrent record of the same Event: count it instead
                    raise
                self.core.patch_namespaced_event(name, namespace, {"lastTimestamp": _ts(now)}, _content_type=MERGE)
        except ApiException as exc:
            log.warning("could not record event", reason=reason, object=ref.name, status=exc.status)


def _ts(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def api_message(exc: ApiException) -> str:
    """The API server's message of an error, with its causes (a PDB refusal names the budget)."""
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.reason)
    causes = "; ".join(str(c.get("message", "")) for c in (body.get("details") or {}).get("causes") or [])
    text = str(body.get("message") or exc.reason)
    return f"{text} ({causes})" if causes else text


def as_dict(obj: Any) -> dict[str, Any]:
    """A plain dict of an API object (kopf bodies and dicts pass through)."""
    return cast(dict[str, Any], dict(obj))
