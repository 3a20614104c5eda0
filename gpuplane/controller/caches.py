"""What the controller reads: its informer streams, each object's transform, and the indexes kept of them.

The read side of the controller (:mod:`gpuplane.informer` lists and watches; nothing here does I/O).
Every fleet-sized resource comes through these streams, not through kopf: kopf would keep a worker,
a memory and a start-up toggle per object (docs/architecture.md, "Reads"). Each index keeps only the
fields the controller reads (:mod:`gpuplane.controller.indexed`), and no body outlives its event:

=====================  ======================  ===================================================
index                  stream                  key -> value
=====================  ======================  ===================================================
``gang_idx``           GpuGangs                ``ns/name`` -> :class:`gang.view.GangView`
``member_pod_idx``     Pods (gang label)       ``ns/name`` -> :class:`gang.podview.MemberPodView`
``claim_consumer_idx`` Pods                    ``ns/claim`` -> names of pods that reference it
``pending_pod_idx``    Pods (unbound, claims)  ``ns/name`` -> :func:`indexed.pending_pod`
``claim_idx``          ResourceClaims          ``ns/name`` -> :func:`indexed.claim`
``slice_idx``          ResourceSlices (ours)   node -> :class:`~gpuplane.controller.node.slice_index.SliceDigest`
``node_idx``           Nodes                   name -> :func:`indexed.node`
``class_idx``          DeviceClasses           name -> :class:`deviceclass.ClassView`
``claim_template_idx`` ResourceClaimTemplates  ``ns/name`` -> :class:`claimtemplate.TemplateView`
``template_idx``       ... right-sizing label  ``ns/name`` -> :class:`claimtemplate.TemplateView`
``gang_job_idx``       Jobs making members     ``ns/gang`` -> :class:`gang.owners.JobView`
``gang_lws_idx``       LeaderWorkerSets        ``ns/gang`` -> :class:`gang.leaderworkersets.LwsView`
=====================  ======================  ===================================================

An object the bounded decoder quarantined (nested too deeply) is in no index: no decision may see it
(the claim handler refuses it with an Event, :mod:`gpuplane.controller.rejects`). A slice whose pool
is not its node's is counted and logged, and left out (:mod:`gpuplane.controller.node.untrusted`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplane.api import names as dn
from gpuplane.controller import claimtemplate, deviceclass, indexed, names, rejects, slim
from gpuplane.controller import metrics as metrics_mod
from gpuplane.controller.gang import leaderworkersets, owners, podview
from gpuplane.controller.gang import view as gang_view
from gpuplane.controller.node import slice_index, untrusted
from gpuplane.controller.rightsize import template as rs_template
from gpuplane.informer.cache import Stream, key_of

RESOURCE = "/apis/resource.k8s.io/v1"
LIST_CHUNK = 100  # objects per listed page
SLICE_PAGE = 10  # ResourceSlices per listed page: a page is decoded whole (an HGX node's slice is ~260 kB of objects)
NOT_INDEXED: Mapping[str, Any] = {}

# The streams whose objects make up the World (a change invalidates the cached plan and World copy).
WORLD_STREAMS = frozenset({"gangs", "pods", "claims", "slices", "nodes", "classes", "jobs", "leaderworkersets"})


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = (obj.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def gang(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if rejects.rejected(obj):  # nested too deeply to read: no decision may see it
        return NOT_INDEXED
    return {key_of(obj): gang_view.view(obj)}


def member_pod(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if rejects.rejected(obj) or names.LABEL_GANG not in _labels(obj):
        return NOT_INDEXED
    return {key_of(obj): podview.view(obj)}


def claim_consumer(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if rejects.rejected(obj):
        return NOT_INDEXED
    meta = obj.get("metadata") or {}
    refs = [r.get("resourceClaimName") for r in (obj.get("spec") or {}).get("resourceClaims") or []]
    refs += [s.get("resourceClaimName") for s in (obj.get("status") or {}).get("resourceClaimStatuses") or []]
    return {f"{meta.get('namespace')}/{r}": meta.get("name") for r in refs if isinstance(r, str) and r}


def pending_pod(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec") or {}
    if (
        rejects.rejected(obj)
        or spec.get("nodeName")
        or not spec.get("resourceClaims")
        or (obj.get("metadata") or {}).get("deletionTimestamp")
    ):
        return NOT_INDEXED
    return {key_of(obj): indexed.pending_pod(obj)}  # bounded: no tenant-sized fields


def claim(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if rejects.rejected(obj):
        return NOT_INDEXED
    return {key_of(obj): indexed.claim(obj)}


def node(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if rejects.rejected(obj):
        return NOT_INDEXED
    return {key_of(obj): indexed.node(obj)}


def device_class(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if rejects.rejected(obj):
        return NOT_INDEXED
    return {key_of(obj): deviceclass.view(obj)}


def claim_template(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if rejects.rejected(obj):
        return NOT_INDEXED
    return {key_of(obj): claimtemplate.view(obj)}


def rightsized_template(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if rs_template.LABEL_REQUEST not in _labels(obj):
        return NOT_INDEXED
    return claim_template(obj)


def gang_job(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    job = None if rejects.rejected(obj) else owners.job_view(obj)
    return NOT_INDEXED if job is None or job.gang is None else {job.gang: job}


def gang_lws(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    lws = None if rejects.rejected(obj) else leaderworkersets.view(obj)
    return NOT_INDEXED if lws is None or lws.gang is None else {lws.gang: lws}


class SliceIndexer:
    """A slice as its digest, keyed by its node (a node's label needs only its own slices)."""

    def __init__(self, metrics: metrics_mod.ControllerMetrics, interner: slice_index.Interner) -> None:
        self.metrics, self.interner = metrics, interner

    def __call__(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        if rejects.rejected(obj):  # nested too deeply to read: no decision may see it
            return NOT_INDEXED
        name = key_of(obj)
        slimmed, digest = slim.digest_of(obj)  # the stream's transform digested it as it was decoded
        if not slimmed:
            digest = slice_index.digest(name, obj.get("spec") or {}, self.interner)
        if digest is None:
            if (reason := slice_index.untrusted(obj.get("spec"))) is not None:  # its pool is not its node's
                untrusted.report(self.metrics, name, obj.get("spec") or {}, reason)
            return NOT_INDEXED
        return {digest.node: digest}


def streams(metrics: metrics_mod.ControllerMetrics) -> list[Stream]:
    """Every stream the controller reads, with its indexes (one slimmer: one MIG device interner per process)."""
    slimmer = slim.Slimmer()
    lws = leaderworkersets
    return [
        Stream(
            "gangs",
            f"/apis/{names.GROUP}/{names.VERSION}/{names.GANG_PLURAL}",
            names.GANG_KIND,
            {"gang_idx": gang},
            page=LIST_CHUNK,
            transform=slimmer,
        ),
        Stream(
            "pods",
            "/api/v1/pods",
            "Pod",
            {"member_pod_idx": member_pod, "claim_consumer_idx": claim_consumer, "pending_pod_idx": pending_pod},
            page=LIST_CHUNK,
            transform=slimmer,
        ),
        Stream("claims", f"{RESOURCE}/resourceclaims", "ResourceClaim", {"claim_idx": claim}, transform=slimmer),
        Stream(
            "slices",
            f"{RESOURCE}/resourceslices",
            slim.SLICE_KIND,
            {"slice_idx": SliceIndexer(metrics, slimmer.interner)},
            page=SLICE_PAGE,
            field_selector=f"spec.driver={dn.DRIVER_NAME}",  # other drivers' slices never reach this process
            transform=slimmer,
        ),
        Stream("nodes", "/api/v1/nodes", "Node", {"node_idx": node}, transform=slimmer),
        Stream("classes", f"{RESOURCE}/deviceclasses", "DeviceClass", {"class_idx": device_class}, transform=slimmer),
        Stream(
            "templates",
            f"{RESOURCE}/resourceclaimtemplates",
            "ResourceClaimTemplate",
            {"claim_template_idx": claim_template, "template_idx": rightsized_template},
            transform=slimmer,
        ),
        Stream("jobs", "/apis/batch/v1/jobs", "Job", {"gang_job_idx": gang_job}, transform=slimmer),
        Stream(
            "leaderworkersets",
            f"/apis/{lws.GROUP}/{lws.VERSION}/{lws.PLURAL}",
            lws.KIND,
            {"gang_lws_idx": gang_lws},
            transform=slimmer,
        ),
    ]
