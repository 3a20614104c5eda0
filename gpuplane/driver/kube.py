"""The driver's Kubernetes API access: one client, built once, and the few calls it makes.

Everything is plain dicts (resource.k8s.io/v1 through the generic custom-objects
API), so the driver does not depend on the Python client's generated DRA models.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

import structlog
from kubernetes import client, config

from gpuplane.api import boundedjson, imex, kuberesponse

log = structlog.get_logger(__name__)

GROUP = "resource.k8s.io"
VERSION = "v1"


class NotFound(Exception):
    pass


def make_api_client(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        return cast(client.ApiClient, config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class ReviewRequests:
    """The two reviews the metrics endpoint asks (``httpauth.review.RequestReviewer``), through this client.

    Only TokenReview and SubjectAccessReview are posted; the answer is read with the bounded decoder."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.authn = client.AuthenticationV1Api(api_client)
        self.authz = client.AuthorizationV1Api(api_client)

    def request(self, method: str, path: str, *, body: Any = None, timeout_s: float = 5.0) -> Any:
        """POST the review at ``path`` (its kind read from the path); its answer as a dict."""
        if method != "POST":
            raise ValueError(f"only reviews are posted here, not {method} {path}")
        raw: Any
        if path.endswith("/tokenreviews"):
            raw = self.authn.create_token_review(body, _preload_content=False, _request_timeout=timeout_s)
        elif path.endswith("/subjectaccessreviews"):
            raw = self.authz.create_subject_access_review(body, _preload_content=False, _request_timeout=timeout_s)
        else:
            raise ValueError(f"not a review: {path}")
        return kuberesponse.read_object(raw)


class KubeApi:
    """Thin wrapper over the API calls the node driver makes."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    # --- claims --------------------------------------------------------------
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim, decoded with a bounded depth: one nested too deeply comes back quarantined (boundedjson)."""
        try:
            raw = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name, _preload_content=False
            )
        except client.ApiException as exc:
            if exc.status == 404:
                raise NotFound(f"ResourceClaim {namespace}/{name} not found") from exc
            raise
        return cast(dict[str, Any], kuberesponse.read_object(raw))

    def write_claim_device_status(
        self, namespace: str, name: str, uid: str, devices: Sequence[Mapping[str, Any]], *, driver: str, node: str
    ) -> None:
        """Make the claim's ``status.devices`` entries of ``driver`` on ``node``'s pool exactly ``devices``.

        Entries of other drivers and pools stay. A merge patch carrying the read ``resourceVersion`` and
        ``uid`` (a server-side apply changed the allocation of some claims: refused, 422), retried on a
        conflict; a claim that is gone or is another object now needs nothing.
        """
        for _ in range(5):
            try:
                claim = self.get_claim(namespace, name)
            except NotFound:
                return
            meta, status = claim.get("metadata") or {}, claim.get("status") or {}
            if meta.get("uid") != uid:
                return
            current = list(status.get("devices") or [])
            kept = [d for d in current if d.get("driver") != driver or d.get("pool") != node]
            wanted = kept + [dict(d) for d in devices]
            if wanted == current:
                return
            patch = {
                "metadata": {"uid": uid, "resourceVersion": meta.get("resourceVersion")},
                "status": {"devices": wanted},
            }
            try:
                self.custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    "resourceclaims",
                    name,
                    patch,
                    _content_type="application/merge-patch+json",
                )
                return
            except client.ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise
        raise RuntimeError(f"ResourceClaim {namespace}/{name} kept changing under five writes of its status.devices")

    def list_claims(self) -> list[dict[str, Any]]:
        """Every claim; one nested too deeply comes cut and marked rejected (boundedjson), the others intact."""
        raw = self.custom.list_cluster_custom_object(GROUP, VERSION, "resourceclaims", _preload_content=False)
        items: list[dict[str, Any]] = kuberesponse.read_list(raw).get("items", [])
        for item in items:
            reason = boundedjson.rejection(item)
            if reason is not None:
                meta = item.get("metadata", {})
                log.warning(
                    "ResourceClaim not readable", claim=f"{meta.get('namespace')}/{meta.get('name')}", why=reason
                )
        return items

    # --- the controller's IMEX plan --------------------------------------------
    def list_imex_domains(self, namespace: str = imex.NAMESPACE) -> list[Any]:
        """The ImexDomain objects in ``namespace``, unparsed ([] where the CRD is not installed)."""
        try:
            raw = self.custom.list_namespaced_custom_object(
                imex.GROUP, imex.VERSION, namespace, imex.PLURAL, _preload_content=False
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return []
            raise
        items = kuberesponse.read_list(raw).get("items")
        return items if isinstance(items, list) else []

    # --- slices --------------------------------------------------------------
    def list_slices(self, node_name: str, driver_name: str) -> list[dict[str, Any]]:
        result = cast(
            dict[str, Any],
            self.custom.list_cluster_custom_object(
                GROUP,
                VERSION,
                "resourceslices",
                field_selector=f"spec.nodeName={node_name},spec.driver={driver_name}",
            ),
        )
        items: list[dict[str, Any]] = result.get("items", [])
        # Belt and braces: never touch another node's or driver's slices.
        return [
            s
            for s in items
            if s.get("spec", {}).get("nodeName") == node_name and s.get("spec", {}).get("driver") == driver_name
        ]

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return cast(
            dict[str, Any],
            self.custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", dict(body)),
        )

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return cast(
            dict[str, Any],
            self.custom.replace_cluster_custom_object(GROUP, VERSION, "resourceslices", name, dict(body)),
        )

    def delete_slice(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    # --- pods (MPS control daemons, gpuplane.driver.sharing.mps_pods) ------------
    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            raw = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], kuberesponse.read_object(raw))

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raw = self.core.create_namespaced_pod(namespace, dict(body), _preload_content=False)  # type: ignore[arg-type]
        return cast(dict[str, Any], kuberesponse.read_object(raw))

    def delete_pod(self, namespace: str, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        raw = self.core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
        items: list[dict[str, Any]] = kuberesponse.read_list(raw).get("items", [])
        return items

    # --- events --------------------------------------------------------------
    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None:
        """Record an Event on a ResourceClaim so the user sees what happened (best effort)."""
        meta = claim.get("metadata", {})
        now = datetime.datetime.now(datetime.UTC)
        # One Event per (claim, reason, message): kubelet retries prepare with backoff, and a
        # repeat bumps the count instead of piling up new Events.
        digest = hashlib.sha256(f"{meta.get('uid')}/{reason}/{message}".encode()).hexdigest()[:16]
        name = f"{str(meta.get('name', 'claim'))[:200]}.{digest}"
        namespace = str(meta.get("namespace", "default"))
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}",
                kind="ResourceClaim",
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component="gpuplane-driver"),
        )
        try:
            self.core.create_namespaced_event(namespace, body)
        except client.ApiException as exc:
            if exc.status != 409:
                log.warning("could not record event", reason=reason, status=exc.status)
                return
            try:
                existing = self.core.read_namespaced_event(name, namespace)
                patch = {"count": (existing.count or 1) + 1, "lastTimestamp": now.isoformat()}
                self.core.patch_namespaced_event(name, namespace, patch)
            except client.ApiException as again:
                log.warning("could not update event", reason=reason, status=again.status)
