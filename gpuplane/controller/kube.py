"""The controller's API writes: one client built once, plain dicts, idempotent by construction.

Every write tolerates having been done already (create -> 409 is fine when the
object is ours, delete -> 404 is fine), because a reconcile may be repeated
after a crash at any point. Reads come from the informers' indexes; the few
reads here are of what no index keeps (a pod's whole body, namespaces' labels,
DeviceTaintRules, the controller's own ConfigMap and ImexDomains).

The requests go through the controller's one client stack (:mod:`gpuplane.informer`,
aiohttp): :class:`KubeWriter` takes anything with its ``request`` (the
:class:`~gpuplane.informer.blocking.BlockingClient` in production, a fake in the
unit tests), and every error is an :class:`~gpuplane.informer.client.ApiError`.

Every write is fenced: it first asks the ``guard`` (the leader elector) and
raises :class:`NotLeader` instead of writing when this replica does not hold
the leader Lease within its renew deadline, so a replica that lost
leadership mid-reconcile stops at the next write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog
from kubernetes import config
from kubernetes.client import Configuration

from gpuplane.api import kubetime
from gpuplane.api.boundedjson import mapping, text
from gpuplane.controller import events, names, steps
from gpuplane.informer.client import JSON, JSON_PATCH, MERGE, REQUEST_TIMEOUT_S, STRATEGIC, Answer, ApiError, Resource

log = structlog.get_logger(__name__)

RESOURCE_GROUP = "resource.k8s.io"
TAINT_RULE_VERSIONS = ("v1", "v1beta2")  # GA in 1.37; beta (off by default) in 1.36
CLAIMS = Resource(RESOURCE_GROUP, "v1", "resourceclaims")
TEMPLATES = Resource(RESOURCE_GROUP, "v1", "resourceclaimtemplates")
GANGS = Resource(names.GROUP, names.VERSION, names.GANG_PLURAL)
GPU_REQUESTS = Resource(names.GROUP, names.VERSION, "gpurequests")
PODS = Resource("", "v1", "pods")
NODES = Resource("", "v1", "nodes")
NAMESPACES = Resource("", "v1", "namespaces")
EVENTS = Resource("", "v1", "events")
CONFIGMAPS = Resource("", "v1", "configmaps")
SUSPENDABLE = {  # step kind -> the owner whose spec.suspend stops its pods
    "suspend-job": Resource("batch", "v1", "jobs"),
    "suspend-jobset": Resource("jobset.x-k8s.io", "v1alpha2", "jobsets"),
}


def load_configuration(kubeconfig: str | None) -> Configuration:
    """The credentials: the kubeconfig file, else the in-cluster service account (its token re-read as it rotates).

    Only the ``kubernetes`` package's loaders are used; the requests go through :mod:`gpuplane.informer`."""
    configuration = Configuration()
    if kubeconfig:
        from_file: Callable[..., None] = config.load_kube_config
        from_file(config_file=kubeconfig, client_configuration=configuration)
    else:
        incluster: Callable[..., None] = config.load_incluster_config
        incluster(client_configuration=configuration)
    return configuration


class Api(Protocol):
    """One request to the API server (:meth:`gpuplane.informer.blocking.BlockingClient.request`)."""

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        answer: Answer = "object",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Any: ...


class StepFailed(RuntimeError):
    """A write of an apply sequence failed; later steps were not run."""


class NotLeader(StepFailed):
    """This replica is not the leader (any more): the write was not made."""


def _always() -> bool:
    return True


class KubeWriter:
    """The writes the reconcilers make, plus the Event recorder; each write fenced by ``guard``."""

    def __init__(self, api: Api, component: str = names.COMPONENT, *, guard: Callable[[], bool] = _always) -> None:
        self.api = api
        self.component = component
        self.guard = guard
        self.rules_version: str | None = None  # the DeviceTaintRule version served, once listed

    def fence(self) -> None:
        """Raise NotLeader unless this replica may write now."""
        if not self.guard():
            raise NotLeader("not the leader: write skipped")

    # --- the verbs (every write fenced; answers of writes never decoded) ---------------------------
    def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One object (decoded with the bound), or None when it does not exist."""
        try:
            got = self.api.request("GET", res.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return got if isinstance(got, dict) else None

    def list_objects(
        self, res: Resource, namespace: str | None = None, *, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The objects of a collection (each nested too deeply comes back quarantined)."""
        params = {"labelSelector": selector} if selector else None
        got = self.api.request("GET", res.path(namespace), params=params, answer="list")
        items = got.get("items") if isinstance(got, Mapping) else None
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def create(self, res: Resource, namespace: str | None, body: Mapping[str, Any], **params: str) -> None:
        self.fence()
        self.api.request("POST", res.path(namespace), params=params or None, body=dict(body), answer="none")

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        content_type: str = MERGE,
        sub: str | None = None,
    ) -> None:
        self.fence()
        path = res.path(namespace, name, sub)
        self.api.request("PATCH", path, body=patch, content_type=content_type, answer="none")

    def replace(self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any]) -> None:
        self.fence()
        self.api.request("PUT", res.path(namespace, name), body=dict(body), answer="none")

    def delete(self, res: Resource, namespace: str | None, name: str, **params: str) -> None:
        self.fence()
        self.api.request("DELETE", res.path(namespace, name), params=params or None, answer="none")

    # --- gangs ------------------------------------------------------------------------------
    def patch_gang_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch the status subresource (no resourceVersion: cannot conflict)."""
        self.patch(GANGS, namespace, name, {"status": dict(patch)}, sub="status")

    # --- steps ------------------------------------------------------------------------------
    def run(self, namespace: str, step: steps.Step) -> None:
        """Execute one step; raise StepFailed on an error that is not 'already done'."""
        if step.kind != "wait":
            self.fence()
        try:
            if step.kind == "create-claim":
                self.create(CLAIMS, namespace, step.body)
            elif step.kind == "delete-claim":
                self.delete(CLAIMS, namespace, step.name)
            elif step.kind == "patch-pod":
                self.patch(PODS, namespace, step.name, step.body, content_type=JSON_PATCH)
            elif step.kind == "delete-pod":
                grace = {} if step.body is None else {"gracePeriodSeconds": str(int(step.body))}
                self.delete(PODS, namespace, step.name, **grace)
            elif step.kind == "evict-pod":
                self._evict(namespace, step)
            elif step.kind in SUSPENDABLE:
                self.patch(SUSPENDABLE[step.kind], namespace, step.name, {"spec": {"suspend": True}})
            elif step.kind == "wait":
                raise StepFailed(step.why)
            else:  # pragma: no cover - kinds are a closed set
                raise StepFailed(f"unknown step kind {step.kind}")
        except ApiError as exc:
            if step.kind == "create-claim" and exc.status == 409:
                return  # created by an earlier attempt; the next plan checks its decision annotation
            if step.kind.startswith(("delete-", "suspend-")) and exc.status == 404:
                return  # gone already: nothing left to delete or to stop
            if step.kind == "evict-pod" and exc.status in (404, 409):
                return  # gone, or replaced by another pod of the name (uid precondition): not the one meant
            if step.kind == "evict-pod" and exc.status == 429:
                raise StepFailed(f"evict-pod {namespace}/{step.name} refused: {exc.said}") from exc
            raise StepFailed(f"{step.kind} {namespace}/{step.name}: {exc.status} {exc.reason}") from exc

    def _evict(self, namespace: str, step: steps.Step) -> None:
        """A gang preemption's eviction (Eviction API, PDBs apply), only of the pod with the step's uid."""
        ev = step.body
        if not isinstance(ev, steps.Eviction) or not ev.uid:
            raise StepFailed(f"evict-pod {namespace}/{step.name}: no uid to pin the eviction to")
        dry_run = {"dryRun": "All"} if ev.dry_run else {}
        self._post_eviction(namespace, step.name, ev.uid, ev.grace_seconds, **dry_run)

    def _post_eviction(self, namespace: str, name: str, uid: str, grace_seconds: int | None, **params: str) -> None:
        options: dict[str, Any] = {"preconditions": {"uid": uid}}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": options,
        }
        self.fence()
        path = PODS.path(namespace, name, "eviction")
        self.api.request("POST", path, params=params or None, body=body, answer="none")

    # --- right-sizing: GpuRequests and their ResourceClaimTemplates -------------------------------
    def create_claim_template(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a ResourceClaimTemplate; 409 (made by an earlier pass) is done."""
        try:
            self.create(TEMPLATES, namespace, body)
        except ApiError as exc:
            if exc.status != 409:
                raise

    def delete_claim_template(self, namespace: str, name: str) -> None:
        """Delete a ResourceClaimTemplate; 404 is done."""
        try:
            self.delete(TEMPLATES, namespace, name)
        except ApiError as exc:
            if exc.status != 404:
                raise

    def patch_gpu_request_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a GpuRequest's status subresource."""
        self.patch(GPU_REQUESTS, namespace, name, {"status": dict(status)}, sub="status")

    # --- steering: the namespaces an administrator opted in ---------------------------------------
    def namespaces_labelled(self, selector: str) -> frozenset[str]:
        """Names of the namespaces matching a label selector (a read: not fenced)."""
        return frozenset(filter(None, map(_name, self.list_objects(NAMESPACES, selector=selector))))

    # --- rebalancing: pods, evictions, DeviceTaintRules -------------------------------------------
    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod as a plain dict (the API's camelCase keys), or None when it is gone."""
        return self.get(PODS, namespace, name)

    def list_pods(self, namespace: str) -> list[dict[str, Any]]:
        """The pods of a namespace as plain dicts."""
        return self.list_objects(PODS, namespace)

    def evict_pod(self, namespace: str, name: str, uid: str) -> str | None:
        """Evict the pod of that uid through the Eviction API (PodDisruptionBudgets apply).

        None when done, else why not (429: a budget; 409: the name is another pod's now, by the uid
        precondition; 404: gone).
        """
        try:
            self._post_eviction(namespace, name, uid, None)
        except ApiError as exc:
            if exc.status == 429:
                return exc.said
            if exc.status == 404:
                return "the pod is gone"
            if exc.status == 409:
                return f"pod {namespace}/{name} is no longer the pod of uid {uid} (uid precondition)"
            raise
        return None

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        """Every namespace's labels (a read: not fenced), for the tier entitlements."""
        out: dict[str, dict[str, str]] = {}
        for n in self.list_objects(NAMESPACES):
            if name := _name(n):
                out[name] = {str(k): str(v) for k, v in mapping(mapping(n.get("metadata")).get("labels")).items()}
        return out

    def _rules(self, version: str | None = None) -> Resource:
        return Resource(RESOURCE_GROUP, version or self.rules_version or TAINT_RULE_VERSIONS[0], "devicetaintrules")

    def list_device_taint_rules(self, label: str) -> list[dict[str, Any]] | None:
        """DeviceTaintRules with a label, at the newest version served (resource.k8s.io/v1 from 1.37,
        v1beta2 on 1.36, remembered); None when neither is served (DRADeviceTaintRules off)."""
        for version in TAINT_RULE_VERSIONS if self.rules_version is None else (self.rules_version,):
            try:
                found = self.list_objects(self._rules(version), selector=f"{label}=true")
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise
            self.rules_version = version
            return found
        return None

    def create_device_taint_rule(self, body: Mapping[str, Any]) -> None:
        """Create a DeviceTaintRule at the version listed (raises ApiError: 404 when the API is not served)."""
        rules = self._rules()
        self.create(rules, None, {**body, "apiVersion": f"{RESOURCE_GROUP}/{rules.version}"})

    def delete_device_taint_rule(self, name: str) -> None:
        """Delete a DeviceTaintRule; 404 is done."""
        try:
            self.delete(self._rules(), None, name)
        except ApiError as exc:
            if exc.status != 404:
                raise

    def annotate_device_taint_rule(self, name: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch annotations onto a DeviceTaintRule."""
        self.patch(self._rules(), None, name, {"metadata": {"annotations": dict(annotations)}})

    # --- claims and nodes ------------------------------------------------------------------------
    def annotate_claim(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations onto a ResourceClaim (None removes one)."""
        self.patch(CLAIMS, namespace, name, {"metadata": {"annotations": dict(annotations)}})

    def set_pod_condition(self, namespace: str, name: str, cond: Mapping[str, Any]) -> None:
        """Strategic-merge one pod condition (conditions merge by type)."""
        patch = {"status": {"conditions": [dict(cond)]}}
        self.patch(PODS, namespace, name, patch, content_type=STRATEGIC, sub="status")

    def fail_pending_pod(self, namespace: str, name: str, reason: str, message: str) -> bool:
        """Set a Pending pod's phase to Failed; False when it is gone or no longer Pending (nothing written)."""
        patch = [
            {"op": "test", "path": "/status/phase", "value": "Pending"},
            {"op": "replace", "path": "/status/phase", "value": "Failed"},
            {"op": "add", "path": "/status/reason", "value": reason},
            {"op": "add", "path": "/status/message", "value": message},
        ]
        try:
            self.patch(PODS, namespace, name, patch, content_type=JSON_PATCH, sub="status")
        except ApiError as exc:
            if exc.status in (404, 409, 422):  # gone, or the phase test failed: not Pending any more
                return False
            raise
        return True

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch a Node's metadata."""
        self.patch(NODES, None, name, dict(patch))

    # --- events (the Recorder protocol) -----------------------------------------------------------
    def event(self, ref: events.ObjectRef, kind: events.EventType, reason: str, message: str) -> None:
        """Record or bump an Event; never raises (and records nothing when not the leader)."""
        if not self.guard():
            return
        namespace = ref.namespace or "default"
        name = events.event_name(ref, reason, message)
        now = kubetime.rfc3339()
        try:
            current = self.get(EVENTS, namespace, name)
            if current is not None:
                count = current.get("count")
                bumped = {"count": (count if isinstance(count, int) else 1) + 1, "lastTimestamp": now}
                self.patch(EVENTS, namespace, name, bumped)
                return
            involved = {
                k: v
                for k, v in (
                    ("apiVersion", ref.api_version),
                    ("kind", ref.kind),
                    ("name", ref.name),
                    ("namespace", ref.namespace),
                    ("uid", ref.uid),
                )
                if v
            }
            body = {
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message[:1024],
                "type": kind,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
                "source": {"component": self.component},
                "reportingComponent": self.component,
            }
            try:
                self.create(EVENTS, namespace, body)
            except ApiError as exc:
                if exc.status != 409:  # a concurrent record of the same Event: count it instead
                    raise
                self.patch(EVENTS, namespace, name, {"lastTimestamp": now})
        except (ApiError, NotLeader) as exc:
            log.warning("could not record event", reason=reason, object=ref.name, error=str(exc))


def _name(obj: Mapping[str, Any]) -> str:
    return text(mapping(obj.get("metadata")).get("name"))
