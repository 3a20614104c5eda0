"""ResourceClaims for this driver: config validation, why a claim stays unallocated, missing domain constraints.

All pure: a claim, the DeviceClasses and (for explanations) a cluster view in; messages out. The
review (config validation, the domain warning) reads the full body the claim handler receives; the
explainer and the fleet's gauges read the claim index, whose
:class:`~gpuplane.controller.indexed.ClaimView` keeps the requests as written, so they take those
(:func:`requests_in`, :func:`ours_in`, :func:`explain_requests`, :class:`ReasonCache`). The opaque
configs are checked with the very models and merge rules the node driver uses at prepare time
(:mod:`gpuplane.api.configs`), so a claim the driver would refuse is flagged before any pod reaches a node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import configs, quantity
from gpuplane.api import names as dn
from gpuplane.api.boundedjson import mapping, mappings
from gpuplane.controller import indexed, names
from gpuplane.controller.claim import no_match
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.node import selectors, snapshot_builder
from gpuplane.controller.node.selectors import class_selectors

_MIG_PROFILE = re.compile(rf'\.{dn.ATTR_MIG_PROFILE}\s*==\s*"([^"]+)"|\["{dn.ATTR_MIG_PROFILE}"\]\s*==\s*"([^"]+)"')
# kube-scheduler marks the ResourceClaim it makes for a pod's extended resources (KEP-5004) with this annotation.
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


@dataclass(frozen=True)
class Request:
    """One device request of a claim (an ``exactly`` or one ``firstAvailable`` alternative)."""

    name: str  # "req" or "req/sub"
    parent: str
    device_class: str
    count: int  # -1 for allocationMode All
    selectors: tuple[str, ...]
    share_percent: int | None = None  # capacity.requests.sharePercent, when the request asks for a share
    share_problem: str | None = None  # why the requested sharePercent is not a share the driver takes


def _body_requests(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A claim body's ``spec.devices.requests`` (what :func:`gpuplane.controller.indexed.claim` keeps of its spec)."""
    return mappings(mapping(mapping(claim.get("spec")).get("devices")).get("requests"))


def requests_of(claim: Mapping[str, Any]) -> Iterator[Request]:
    """Every request and firstAvailable alternative of a claim body."""
    return requests_in(_body_requests(claim))


def requests_in(requests: Iterable[Mapping[str, Any]]) -> Iterator[Request]:
    """Every request and firstAvailable alternative of ``spec.devices.requests`` (a claim view's ``requests``)."""
    for req in requests:
        name = str(req.get("name", ""))
        alternatives = (
            [(name, req.get("exactly"))]
            if req.get("exactly")
            else [(f"{name}/{sub.get('name', '')}", sub) for sub in req.get("firstAvailable") or []]
        )
        for full, body in alternatives:
            if not body:
                continue
            mode = body.get("allocationMode", "ExactCount")
            share = ((body.get("capacity") or {}).get("requests") or {}).get(dn.CAP_SHARE_PERCENT)
            share_percent, share_problem = _share(share)
            yield Request(
                name=full,
                parent=name,
                device_class=str(body.get("deviceClassName", "")),
                count=-1 if mode == "All" else int(body.get("count", 1) or 1),
                selectors=tuple(str((s.get("cel") or {}).get("expression", "")) for s in body.get("selectors") or []),
                share_percent=share_percent,
                share_problem=share_problem,
            )


def _share(value: Any) -> tuple[int | None, str | None]:
    """A requested sharePercent: (the percentage, None) or (None, why it is not a whole 1..100)."""
    if value is None:
        return None, None
    try:
        return quantity.share_percent(value), None
    except ValueError as exc:
        return None, f"capacity.requests.{exc}; the driver refuses it"


def class_is_ours(device_class: ClassView | None) -> bool:
    """A DeviceClass selects this driver's devices (by its selectors or its config); None: no such class."""
    return device_class is not None and device_class.ours


def class_device_type(device_class: ClassView | None) -> str:
    """``mig`` when the class selects MIG devices, else ``gpu``."""
    return device_class.device_type if device_class is not None else dn.DEVICE_TYPE_GPU


def is_ours(claim: Mapping[str, Any], classes: Mapping[str, ClassView]) -> bool:
    """Whether any request of the claim body uses one of this driver's classes."""
    return ours_in(_body_requests(claim), classes)


def ours_in(requests: Iterable[Mapping[str, Any]], classes: Mapping[str, ClassView]) -> bool:
    """Whether any of ``requests`` (``spec.devices.requests``) uses one of this driver's classes."""
    return any(class_is_ours(classes.get(r.device_class)) for r in requests_in(requests))


def validate(claim: Mapping[str, Any], classes: Mapping[str, ClassView]) -> list[str]:
    """Problems with the claim's opaque configs for this driver, one message per request (empty: valid)."""
    spec_devices = (claim.get("spec") or {}).get("devices") or {}
    claim_entries = [
        configs.SourcedConfig(
            source="FromClaim",
            requests=tuple(c.get("requests") or ()),
            parameters=(c.get("opaque") or {}).get("parameters") or {},
        )
        for c in spec_devices.get("config") or []
        if (c.get("opaque") or {}).get("driver") == dn.DRIVER_NAME
    ]
    problems: list[str] = []
    checked = False
    for req in requests_of(claim):
        dclass = classes.get(req.device_class)
        if not class_is_ours(dclass):
            continue
        checked = True
        if req.share_problem:
            problems.append(f"request {req.name!r}: {req.share_problem}")
        class_entries = [
            configs.SourcedConfig(source="FromClass", requests=(), parameters=parameters)
            for parameters in (dclass.configs if dclass is not None else ())
        ]
        try:
            merged = configs.merge_configs([*class_entries, *claim_entries], req.name, class_device_type(dclass))
        except configs.ConfigError as exc:
            problems.append(str(exc))
            continue
        if req.share_percent is not None and req.share_percent < 100 and merged.sharing.strategy == "Exclusive":
            problems.append(
                f"request {req.name!r} asks for sharePercent {req.share_percent} but its sharing strategy is "
                "Exclusive; the driver will refuse it. Use an MPS tier class (e.g. mps-bronze.gpu.gpuplane.dev) "
                "or a TimeSlicing config, or drop the capacity request to hold the whole GPU"
            )
    if not checked:
        # Configs for this driver on a claim whose requests use no class of ours: still parse them.
        for i, entry in enumerate(claim_entries):
            try:
                configs.parse_claim_config(entry.parameters, f"claim config #{i}")
            except configs.ConfigError as exc:
                problems.append(str(exc))
    return list(dict.fromkeys(problems))


def domain_warning(claim: Mapping[str, Any], classes: Mapping[str, ClassView]) -> str | None:
    """A warning when a multi-GPU request of this driver has no NVLink-domain matchAttribute constraint.

    Not for the scheduler's claim behind an extended resource (``nvidia.com/gpu: 2``): KEP-5004 builds
    its requests without constraints and nobody can add one, so the warning would only be noise; on a
    node with one NVLink domain its GPUs share it anyway (docs/operations.md says when to use a claim).
    """
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    if annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true":
        return None
    constraints = ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []
    covered_all = False
    covered: set[str] = set()
    for c in constraints:
        if c.get("matchAttribute") != names.MATCH_ATTRIBUTE_DOMAIN:
            continue
        reqs = c.get("requests") or []
        if not reqs:
            covered_all = True
        covered.update(reqs)
    multi = [
        r
        for r in requests_of(claim)
        if (r.count > 1 or r.count == -1)
        and class_device_type(classes.get(r.device_class)) == dn.DEVICE_TYPE_GPU
        and class_is_ours(classes.get(r.device_class))
    ]
    bare = [r.name for r in multi if not covered_all and r.name not in covered and r.parent not in covered]
    if not bare:
        return None
    return (
        f"request(s) {', '.join(bare)} ask for several GPUs without a constraint "
        f"matchAttribute: {names.MATCH_ATTRIBUTE_DOMAIN}; the GPUs may land in different NVLink domains "
        f"(add constraints: [{{requests: [{bare[0].split('/')[0]}], matchAttribute: {names.MATCH_ATTRIBUTE_DOMAIN}}}])"
    )


def mig_profile_of(request: Request) -> str | None:
    """The driver MIG profile a request selects by CEL (``migProfile == "3g.71gb"``), if any."""
    for expr in request.selectors:
        m = _MIG_PROFILE.search(expr)
        if m:
            return m.group(1) or m.group(2)
    return None


def explain_requests(
    requests: Iterable[Mapping[str, Any]],
    classes: Mapping[str, ClassView],
    view: snapshot_builder.ClusterView,
) -> str:
    """Why ``requests`` (``spec.devices.requests``) find no room now, from the placement view ('' when they
    look satisfiable)."""
    reasons: list[str] = []
    for req in requests_in(requests):
        dclass = classes.get(req.device_class)
        if not class_is_ours(dclass):
            continue
        compiled = selectors.compile_all([*class_selectors(dclass), *req.selectors])
        if class_device_type(dclass) == dn.DEVICE_TYPE_MIG:
            # MIG selectors name MIG attributes: count placements on every parent GPU.
            profile = mig_profile_of(req)
            geo_profile = view.profiles.get(profile or "")
            if profile is None:
                continue
            if geo_profile is None:
                reasons.append(f"request {req.name}: no node publishes MIG profile {profile}")
                continue
            snap = view.snapshot(None, mig_profile=profile)  # only the GPU models whose profile it is
            free = [g for g in snap.gpus() if snap.slots.can_host(snap.state(g), geo_profile)]
            if len(free) >= max(1, req.count):
                continue
            blocks = [snap.slots.largest_free(snap.state(g)) for g in snap.gpus()]
            largest = max((b for b in blocks if b is not None), key=lambda p: (p.compute, p.memory), default=None)
            own = {name for g in snap.gpus() for name in view.mig_published.get(g.id, ())}
            names_ = [n for n in view.driver_profile_names(largest.name) if n in own] if largest else []
            shown = (names_ or [largest.name])[0] if largest else "none (every such GPU is taken)"
            reasons.append(
                f"no free placement for profile {profile} ({len(free)} of {max(1, req.count)} needed on GPUs that "
                f"publish it); largest free block per GPU is {shown}"
            )
        else:
            admitted = view.snapshot(compiled.predicate)
            if view.gpus and not any(n.gpus for d in admitted.domains for n in d.nodes):
                exprs = class_selectors(dclass)
                reasons.append(no_match.reason(req.name, req.device_class, exprs, req.selectors, view))
                continue
            want = max(1, req.count)
            node_free = max((n.free_whole for d in admitted.domains for n in d.nodes), default=0)
            dom_free = max((d.free_whole for d in admitted.domains), default=0)
            total = sum(d.free_whole for d in admitted.domains)
            if req.count == -1 or want <= node_free:
                continue
            reasons.append(
                f"request {req.name} needs {want} GPUs on one node; largest free block: {node_free} GPUs on one "
                f"node, {dom_free} in one NVLink domain, {total} free in all"
            )
    return "; ".join(reasons)


class ReasonCache:
    """:func:`explain_requests` memoised per placement view: claims of one template share one answer.

    The answer depends only on the claim's requests, their classes and the view; with 7,200 pending
    claims from one template (the fleet benchmark), every pass built 7,200 snapshots of the whole fleet
    to say the same thing. The cache holds the view it answers for and starts over with a new one.
    A claim asked about again under the same view and the same classes gets its answer by uid (a
    claim's spec is immutable), without its requests encoded again: the explainer asks about every
    pending claim every pass, and most passes of a quiet cluster see the same view.
    """

    def __init__(self, size: int = 1024, claims: int = 100_000) -> None:
        self.size, self.claims = size, claims
        self._view: snapshot_builder.ClusterView | None = None
        self._reasons: dict[str, str] = {}
        self._by_uid: dict[tuple[str, str], str] = {}
        self._classes: tuple[Mapping[str, ClassView], str] | None = None
        self.hits = 0

    def _classes_key(self, classes: Mapping[str, ClassView]) -> str:
        """The classes as text, encoded once per classes mapping (the explainer passes one per pass)."""
        if self._classes is None or self._classes[0] is not classes:
            self._classes = (classes, json.dumps(classes, sort_keys=True, default=str))
        return self._classes[1]

    def reason(
        self,
        claim: indexed.ClaimView,
        classes: Mapping[str, ClassView],
        view: snapshot_builder.ClusterView,
    ) -> str:
        """``explain_requests(claim.requests, classes, view)``, computed once per distinct requests and view."""
        if view is not self._view:
            self._view, self._reasons, self._by_uid = view, {}, {}
        uid = claim.uid
        key = (uid, self._classes_key(classes))
        known = self._by_uid.get(key) if uid else None
        if known is not None:
            self.hits += 1
            return known
        got = self._by_requests(claim.requests, classes, view)
        if uid:
            if len(self._by_uid) >= self.claims:
                self._by_uid.clear()
            self._by_uid[key] = got
        return got

    def _by_requests(
        self,
        requests: tuple[Mapping[str, Any], ...],
        classes: Mapping[str, ClassView],
        view: snapshot_builder.ClusterView,
    ) -> str:
        used = sorted({r.device_class for r in requests_in(requests)})
        key = json.dumps([requests, [(n, classes.get(n)) for n in used]], sort_keys=True, default=str)
        got = self._reasons.get(key)
        if got is not None:
            self.hits += 1
            return got
        got = explain_requests(requests, classes, view)
        if len(self._reasons) >= self.size:
            self._reasons.clear()
        self._reasons[key] = got
        return got
