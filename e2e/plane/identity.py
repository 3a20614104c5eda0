"""Service-account identities for the driver and the controller, as their pods would have them.

In a cluster the kubelet projects a service-account token into each pod; the
token is bound to the pod, and (``ServiceAccountTokenPodNodeInfo``, GA since
1.32) the API server adds the pod's node to the authenticated user's extra
``authentication.kubernetes.io/node-name``. The driver's admission policy
(``manifests/policies``) keys on that node name.

Without kubelets, this module does the same through the TokenRequest API:

- ``stand_in_pod`` creates a Pod object for the service account with
  ``spec.nodeName`` set (it never runs; it only anchors the token binding);
- ``request_token`` asks for a token bound to that pod (or to a Node, or unbound);
- ``write_token_kubeconfig`` writes a kubeconfig carrying the token;
- ``driver_identity(cluster, node, dir)`` and ``controller_identity(cluster, dir)``
  do all three for the identities the manifests define.

The service accounts and their RBAC come from the manifests
(``kubectl apply -k manifests/``); ``ensure_service_account`` exists for tests
that need an identity before (or without) them.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from e2e.cluster.handle import Cluster

NAMESPACE = "gpuplane-system"
DRIVER_SA = "gpuplane-driver"
CONTROLLER_SA = "gpuplane-controller"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
STAND_IN_IMAGE = "registry.k8s.io/pause:3.10"
TOKEN_SECONDS = 3600
"""TokenRequest's default lifetime: long enough for a test session."""
LONG_TOKEN_SECONDS = 24 * 3600
"""For a cluster left running (``python -m e2e up``/``demo``): a day. The processes read their
kubeconfig once, so after that they get 401s; ``python -m e2e down`` and ``up`` again."""


def username(namespace: str, service_account: str) -> str:
    """The user name the API server gives a service account's tokens."""
    return f"system:serviceaccount:{namespace}:{service_account}"


@dataclasses.dataclass(frozen=True)
class Identity:
    """A service-account identity with a kubeconfig that authenticates as it."""

    namespace: str
    service_account: str
    kubeconfig: Path
    token: str
    node_name: str | None = None
    """The node the token is bound to (through a pod), or None for an unbound token."""

    @property
    def username(self) -> str:
        """``system:serviceaccount:<namespace>:<name>``."""
        return username(self.namespace, self.service_account)

    def api_client(self) -> client.ApiClient:
        """A new API client authenticating with this identity's token (close it when done)."""
        return new_client(self.kubeconfig)


def new_client(kubeconfig: Path) -> client.ApiClient:
    """An API client for ``kubeconfig``."""
    load: Callable[..., client.ApiClient] = config.new_client_from_config
    return load(config_file=str(kubeconfig), persist_config=False)


def ensure_service_account(api: client.ApiClient, namespace: str, name: str) -> None:
    """Create the namespace and service account if missing."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    try:
        core.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
        )
    except ApiException as exc:
        if exc.status != 409:
            raise


def wait_service_account(api: client.ApiClient, namespace: str, name: str, timeout: float = 30.0) -> None:
    """Wait until the service account exists (after an apply)."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account(name, namespace)
            return
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def stand_in_pod(api: client.ApiClient, namespace: str, service_account: str, node_name: str) -> client.V1Pod:
    """A Pod of ``service_account`` bound to ``node_name`` that anchors a node-bound token.

    Reused if it exists on the same node; replaced if it is bound elsewhere. The token
    stays valid only while the pod exists; a kubelet stand-in on that node reports it
    Running (it runs nothing: the process holding the token runs beside it).
    """
    core = client.CoreV1Api(api)
    name = f"{service_account}-identity-{node_name}"[:253]
    try:
        pod: client.V1Pod = core.read_namespaced_pod(name, namespace)
        meta = pod.metadata or client.V1ObjectMeta()
        if pod.spec is not None and pod.spec.node_name == node_name and meta.deletion_timestamp is None:
            return pod
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        _wait_gone(core, namespace, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=namespace,
            # Not the workload's app.kubernetes.io/name: a DaemonSet whose selector matched would
            # adopt the pod and delete it (it is on no node the DaemonSet targets), and the token with it.
            labels={"gpuplane.dev/e2e-identity": service_account},
        ),
        spec=client.V1PodSpec(
            service_account_name=service_account,
            node_name=node_name,
            containers=[client.V1Container(name="identity", image=STAND_IN_IMAGE)],
            tolerations=[client.V1Toleration(operator="Exists")],
        ),
    )
    created: client.V1Pod = core.create_namespaced_pod(namespace, body)
    return created


def _wait_gone(core: client.CoreV1Api, namespace: str, name: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.2)
    raise TimeoutError(f"pod {namespace}/{name} still present after {timeout:.0f}s")


def request_token(
    api: client.ApiClient,
    namespace: str,
    service_account: str,
    *,
    bound_pod: client.V1Pod | None = None,
    bound_node: client.V1Node | None = None,
    seconds: int = TOKEN_SECONDS,
) -> str:
    """A TokenRequest token for the service account, bound to a pod or node if given."""
    ref: client.V1BoundObjectReference | None = None
    if bound_pod is not None and bound_pod.metadata is not None:
        meta = bound_pod.metadata
        ref = client.V1BoundObjectReference(api_version="v1", kind="Pod", name=meta.name, uid=meta.uid)
    elif bound_node is not None and bound_node.metadata is not None:
        meta = bound_node.metadata
        ref = client.V1BoundObjectReference(api_version="v1", kind="Node", name=meta.name, uid=meta.uid)
    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds, bound_object_ref=ref)
    )
    answer = client.CoreV1Api(api).create_namespaced_service_account_token(service_account, namespace, body)
    if answer.status is None or not answer.status.token:
        raise RuntimeError(f"TokenRequest for {namespace}/{service_account} returned no token")
    return str(answer.status.token)


def write_token_kubeconfig(path: Path, admin_kubeconfig: Path, token: str, user: str) -> Path:
    """A kubeconfig for the admin kubeconfig's cluster that authenticates with ``token``."""
    admin: dict[str, Any] = yaml.safe_load(admin_kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]["cluster"]
    ca_data = cluster_entry.get("certificate-authority-data")
    if ca_data is None and "certificate-authority" in cluster_entry:
        ca_data = base64.b64encode(Path(cluster_entry["certificate-authority"]).read_bytes()).decode()
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpuplane-e2e",
                "cluster": {"server": cluster_entry["server"], "certificate-authority-data": ca_data},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "gpuplane-e2e", "user": user}}],
        "current-context": user,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def driver_identity(cluster: Cluster, node_name: str, out_dir: Path, *, seconds: int = TOKEN_SECONDS) -> Identity:
    """The node driver's identity on ``node_name``: a token bound to a driver pod on that node."""
    wait_service_account(cluster.api, NAMESPACE, DRIVER_SA)
    pod = stand_in_pod(cluster.api, NAMESPACE, DRIVER_SA, node_name)
    token = request_token(cluster.api, NAMESPACE, DRIVER_SA, bound_pod=pod, seconds=seconds)
    path = write_token_kubeconfig(
        out_dir / f"driver-{node_name}.kubeconfig", cluster.kubeconfig, token, username(NAMESPACE, DRIVER_SA)
    )
    return Identity(NAMESPACE, DRIVER_SA, path, token, node_name)


def controller_identity(cluster: Cluster, out_dir: Path, *, seconds: int = TOKEN_SECONDS) -> Identity:
    """The controller's identity: an unbound token of its service account."""
    wait_service_account(cluster.api, NAMESPACE, CONTROLLER_SA)
    token = request_token(cluster.api, NAMESPACE, CONTROLLER_SA, seconds=seconds)
    path = write_token_kubeconfig(
        out_dir / "controller.kubeconfig", cluster.kubeconfig, token, username(NAMESPACE, CONTROLLER_SA)
    )
    return Identity(NAMESPACE, CONTROLLER_SA, path, token)


def whoami(identity_client: client.ApiClient) -> dict[str, Any]:
    """What the API server authenticates this client as (SelfSubjectReview): username, groups, extra."""
    review = client.AuthenticationV1Api(identity_client).create_self_subject_review(
        client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
    )
    info = review.status.user_info if review.status is not None else None
    if info is None:
        raise RuntimeError("SelfSubjectReview returned no user info")
    return {"username": info.username, "groups": list(info.groups or []), "extra": dict(info.extra or {})}
