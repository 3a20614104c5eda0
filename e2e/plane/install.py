"""Installing gpuplane's manifests into a cluster: render, apply, wait, migrate CRD storage.

``render(cluster, path)`` runs ``kubectl kustomize`` (the kustomize built into
kubectl, as ``kubectl apply -k`` uses it) and returns the objects;
``apply(cluster, path)`` applies a kustomization; ``wait_established`` waits for
CRDs; ``migrate_storage`` rewrites every object of a CRD in its current storage
version and then drops the old versions from ``status.storedVersions``, the
step an upgrade that changes a CRD's storage version needs before an old
version may stop being served.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster.handle import Cluster

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"


def render(cluster: Cluster, path: Path = MANIFESTS) -> list[dict[str, Any]]:
    """The objects the kustomization at ``path`` renders."""
    text = cluster.kubectl("kustomize", str(path))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def apply(cluster: Cluster, path: Path = MANIFESTS, *extra: str, timeout: float = 120) -> str:
    """``kubectl apply -k path`` (plus ``extra`` flags); returns kubectl's output."""
    return cluster.kubectl("apply", "-k", str(path), *extra, timeout=timeout)


def crd_names(objects: Iterable[dict[str, Any]]) -> list[str]:
    """Names of the CustomResourceDefinitions among ``objects``."""
    return [o["metadata"]["name"] for o in objects if o.get("kind") == "CustomResourceDefinition"]


def wait_established(cluster: Cluster, names: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until every named CRD reports Established=True (its resources are served)."""
    ext = client.ApiextensionsV1Api(cluster.api)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = ext.read_custom_resource_definition(name)
            conditions = (crd.status.conditions if crd.status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not established after {timeout:.0f}s")
            time.sleep(0.2)


def storage_version(crd: Any) -> str:
    """The version a CRD stores new writes in."""
    for version in crd.spec.versions:
        if version.storage:
            return str(version.name)
    raise ValueError(f"CRD {crd.metadata.name} has no storage version")


def migrate_storage(cluster: Cluster, crd_name: str) -> int:
    """Rewrite every object of ``crd_name`` in the storage version; then storedVersions = [it].

    Returns how many objects were rewritten. A no-op update makes the API server
    encode the object anew in the storage version (what kube-storage-version-migrator does).
    """
    ext = client.ApiextensionsV1Api(cluster.api)
    custom = client.CustomObjectsApi(cluster.api)
    crd = ext.read_custom_resource_definition(crd_name)
    group, plural, version = crd.spec.group, crd.spec.names.plural, storage_version(crd)
    namespaced = crd.spec.scope == "Namespaced"
    listing = cast(dict[str, Any], custom.list_cluster_custom_object(group, version, plural))
    rewritten = 0
    for item in listing.get("items", []):
        meta = item["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        body = item
        for _attempt in range(5):
            try:
                if namespaced:
                    custom.replace_namespaced_custom_object(group, version, ns, plural, name, body)
                else:
                    custom.replace_cluster_custom_object(group, version, plural, name, body)
                rewritten += 1
                break
            except ApiException as exc:
                if exc.status == 404:
                    break
                if exc.status != 409:
                    raise
                body = (
                    custom.get_namespaced_custom_object(group, version, ns, plural, name)
                    if namespaced
                    else custom.get_cluster_custom_object(group, version, plural, name)
                )
    ext.patch_custom_resource_definition_status(crd_name, {"status": {"storedVersions": [version]}})
    return rewritten


def objects_json(objects: Iterable[dict[str, Any]]) -> str:
    """A kubectl-readable List of ``objects`` (for ``kubectl apply -f -``)."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
