"""One ResourceClaim's review: what to record about its config and its NVLink-domain constraint, and the writes.

:func:`decide` is pure: the claim, the DeviceClasses and the claim's consumer pods in, a
:class:`Review` out: the annotation updates that record each finding once, the Warning Events,
and the ``ClaimConfig`` condition of each consumer pod. :func:`apply` makes those writes, in the
order the findings were made (config Event, pod conditions, domain-constraint Event, then the
annotations, so a crash before the last write repeats the review instead of losing it), like
:func:`gpuplane.controller.gang.reconciler.apply` does for a gang.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from gpuplane.api import names as dn
from gpuplane.controller import events, indexed, kube, names
from gpuplane.controller.claim import checks
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.gang import status

log = structlog.get_logger(__name__)

EventTuple = tuple[events.EventType, str, str]


@dataclass(frozen=True)
class Review:
    """What to write for one claim; ``findings`` name what was found (for the metrics)."""

    namespace: str
    name: str
    ref: events.ObjectRef
    config_event: EventTuple | None = None
    pod_conditions: tuple[tuple[str, dict[str, Any]], ...] = ()
    domain_event: EventTuple | None = None
    annotations: Mapping[str, str | None] | None = None
    findings: tuple[str, ...] = ()
    error: str | None = None  # the config error, recorded or not yet: its pending pods are failed


SPECS = indexed.Shapes()  # claims' specs, shared between equal ones (a template's claims) while kept


def essentials(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a review (and failing the consumers of an invalid claim) reads of a claim, and nothing else.

    Kept while the claim waits for its review (at start-up, until every object is indexed): the
    identity, annotations and owner references, the pods it is reserved for, and its spec, which is
    shared with every equal spec (claims of one template) instead of copied per claim.
    """
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    if isinstance(meta.get("annotations"), Mapping):
        kept["annotations"] = dict(meta["annotations"])
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, Mapping)]
    if owners:
        kept["ownerReferences"] = [{k: o.get(k) for k in ("kind", "name", "uid", "controller")} for o in owners]
    reserved = ((body.get("status") or {}).get("reservedFor")) or []
    out: dict[str, Any] = {k: body[k] for k in ("apiVersion", "kind") if k in body}
    out["metadata"] = kept
    out["spec"] = SPECS(copy.deepcopy(body.get("spec") or {}))
    if reserved:
        out["status"] = {"reservedFor": [dict(r) for r in reserved if isinstance(r, Mapping)]}
    return out


def has_our_config(claim: Mapping[str, Any]) -> bool:
    """The claim carries an opaque config for this driver."""
    cfgs = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
    return any((c.get("opaque") or {}).get("driver") == dn.DRIVER_NAME for c in cfgs)


def decide(
    claim: Mapping[str, Any], classes: Mapping[str, ClassView], consumers: Iterable[str], now: str
) -> Review | None:
    """The review of ``claim`` (None when it is none of this driver's business). Pure.

    A config error is recorded (annotation, Warning, each consumer pod's condition) when it
    changes, a missing domain constraint once (annotation ``warned``).
    """
    if not checks.is_ours(claim, classes) and not has_our_config(claim):
        return None
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    annotations = meta.get("annotations") or {}
    ref = events.ObjectRef.of(claim, "resource.k8s.io/v1", "ResourceClaim")
    error = "; ".join(checks.validate(claim, classes)) or None
    updates: dict[str, str | None] = {}
    findings: list[str] = []
    config_event: EventTuple | None = None
    conditions: list[tuple[str, dict[str, Any]]] = []
    if error != annotations.get(names.ANNOTATION_CONFIG_ERROR):
        updates[names.ANNOTATION_CONFIG_ERROR] = error
        if error:
            findings.append("invalid-config")
            config_event = ("Warning", events.CLAIM_INVALID_CONFIG, error)
        for pod in consumers:
            cond = status.condition(
                names.POD_CONDITION_CLAIM_CONFIG,
                error is None,
                "InvalidDeviceConfig" if error else "Valid",
                f"ResourceClaim {name}: {error}" if error else "",
                previous=None,
                now=now,
            )
            conditions.append((pod, cond))
    domain_event: EventTuple | None = None
    warning = checks.domain_warning(claim, classes)
    if warning and annotations.get(names.ANNOTATION_DOMAIN_WARNING) != "warned":
        updates[names.ANNOTATION_DOMAIN_WARNING] = "warned"
        findings.append("no-domain-constraint")
        domain_event = ("Warning", events.CLAIM_NO_DOMAIN_CONSTRAINT, warning)
    return Review(
        namespace=ns,
        name=name,
        ref=ref,
        config_event=config_event,
        pod_conditions=tuple(conditions),
        domain_event=domain_event,
        annotations=updates or None,
        findings=tuple(findings),
        error=error,
    )


def apply(writer: kube.KubeWriter, review: Review) -> None:
    """Make the review's writes in order; a pod that vanished is not an error of the claim."""
    if review.config_event is not None:
        writer.event(review.ref, *review.config_event)
    for pod, cond in review.pod_conditions:
        try:
            writer.set_pod_condition(review.namespace, pod, cond)
        except Exception as exc:  # a vanished pod is not an error of the claim
            log.info("could not set pod condition", pod=pod, error=str(exc))
    if review.domain_event is not None:
        writer.event(review.ref, *review.domain_event)
    if review.annotations:
        writer.annotate_claim(review.namespace, review.name, review.annotations)


NOTES_KEPT = 10_000  # claims whose recorded findings a replica remembers (oldest forgotten first)


def with_notes(claim: Mapping[str, Any], notes: Mapping[str, Mapping[str, str | None]]) -> Mapping[str, Any]:
    """``claim`` with the annotations this replica already wrote on it laid over its (maybe older) body.

    Claim events arrive with bodies older than the controller's own annotation (the scheduler's
    allocation, kubelet's reservation); reviewed as they are, each recorded the same finding again.
    """
    meta = claim.get("metadata") or {}
    written = notes.get(str(meta.get("uid") or ""))
    if not written:
        return claim
    annotations = {**(meta.get("annotations") or {}), **written}
    return {**claim, "metadata": {**meta, "annotations": {k: v for k, v in annotations.items() if v is not None}}}


def remember(notes: dict[str, dict[str, str | None]], found: Review, uid: str) -> None:
    """Record the annotations ``found`` wrote (bounded: the oldest claim is forgotten first)."""
    if not uid or not found.annotations:
        return
    notes[uid] = {**notes.pop(uid, {}), **found.annotations}
    while len(notes) > NOTES_KEPT:
        notes.pop(next(iter(notes)))
