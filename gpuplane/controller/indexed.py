"""What the controller's indexes keep of a ResourceClaim, a Node and a pending Pod: the fields it reads, nothing else.

The indexes are the controller's cache of the cluster. Keeping whole objects (managed fields,
specs, conditions) made the controller's memory grow with everything users and kubelets write;
at 1,000 nodes and 10,000 claims that alone is hundreds of megabytes. Each object is parsed once, as
its event is decoded, into a typed, frozen view of what the controller reads (no reader walks a dict):

* a claim: a :class:`ClaimView`: its name, namespace, uid, the decision and rebalancing annotations, the
  gang and member-index labels (a claim with the gang label is a gang's, never an IMEX group's: the node
  driver reads it so too), the IMEX group label (and then the creation time: :mod:`gpuplane.controller.imex.groups`),
  owner references to GpuGangs and to Pods (name, uid, whether it is the controller: a template
  member's claim; steering ends a steered pod's reservation when a claim it owns is allocated), the
  deletion mark, its requests as written (gang shape checks read class, mode and count; steering
  reads selectors, capacity and admin access too; rebalancing each firstAvailable alternative's
  class: a tier), whether it is allocated, the results of this driver only (request, pool,
  device, consumed share percent) and the pods it is reserved for (rebalancing reads the tier, the
  share and the pods of each claim on a noisy GPU);
* a node: a typed, frozen :class:`NodeView`: whether it is schedulable, its name and uid (for Events),
  every label (steering and the MIG offer match a pod's nodeSelector and node affinity against them;
  the NVLink-domain and MIG-offered labels are two), the NVLink-domain annotation the controller
  maintains, and its InternalIP (the IMEX domain's daemon addresses);
* an unbound pod with a claim: a typed, frozen :class:`PodView`: its identity, gates, claims, node
  selector, the affinity as written (steering writes it back whole), gpuplane's own annotation keys and
  the size of all of them (steering and the MIG offer read it).

Pure functions of the object (a claim's or a pod's field of the wrong type reads as absent); ``single``
reads such an index back as a plain dict. What repeats from claim to claim is kept once: the short
strings (namespace, request, pool and device names) interned, and the requests shared between claims
whose requests are equal (claims made from one template are), through :data:`REQUESTS` (the last
:data:`MAX_SHAPES` distinct ones). Index entries are read-only: every reader copies before it changes.
"""

from __future__ import annotations

import copy
import json
import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuplane.api import imex, imex_group
from gpuplane.api import names as dn
from gpuplane.api.boundedjson import EMPTY, empty, mapping, mappings, strings, text
from gpuplane.controller import names

MAX_SHAPES = 1024  # distinct request lists shared between claims (more are kept per claim, not shared)
MAX_INTERNED = 253  # longer strings are not interned (a DNS subdomain is the longest name the API takes)
REBALANCE_ANNOTATION = "gpuplane.dev/noisy-neighbour-decision"  # rebalance.act.ANNOTATION (a test checks)
_ANNOTATIONS = (names.ANNOTATION_DECISION, REBALANCE_ANNOTATION, names.ANNOTATION_EXPLAINED)


class Shapes:
    """One shared object per distinct value (equal as JSON), for the ``size`` most recently seen."""

    def __init__(self, size: int = MAX_SHAPES) -> None:
        self.size = size
        self._lru: OrderedDict[str, Any] = OrderedDict()

    def __call__(self, value: Any) -> Any:
        try:
            key = json.dumps(value, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError):  # not JSON (a test's object): kept as it is
            return value
        got = self._lru.get(key)
        if got is not None:
            self._lru.move_to_end(key)
            return got
        self._lru[key] = value
        if len(self._lru) > self.size:
            self._lru.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._lru)


REQUESTS = Shapes()  # process-wide, like the slice interner: it holds values, never decisions


def _i(value: Any) -> Any:
    """``value`` interned where it is a short string (names that repeat across claims), else as it is."""
    return sys.intern(value) if isinstance(value, str) and len(value) <= MAX_INTERNED else value


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """One device this driver allocated to a claim (``status.allocation.devices.results[]``)."""

    request: str  # the request (or "request/subrequest") it was allocated for
    pool: str
    device: str
    share_percent: Any = None  # consumedCapacity sharePercent as written (a quantity); None: the whole device

    @property
    def key(self) -> str:
        """``pool/device``: the device's name in the placement snapshot."""
        return f"{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """A claim's owner reference to a GpuGang or a Pod (the only kinds the controller reads)."""

    kind: str
    name: str
    uid: str = ""
    api_version: str = ""
    controller: bool = False


@dataclass(frozen=True, slots=True)
class Consumer:
    """An entry of a claim's ``status.reservedFor``."""

    resource: str
    name: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class ClaimView:
    """A ResourceClaim as the controller reads it: parsed once, at the informer, into what it uses; read-only.

    ``requests`` are the claim's ``spec.devices.requests`` as written (the API caps them; steering reads
    any field of them), shared between claims whose requests are equal; everything else is typed.
    """

    name: str
    namespace: str = ""
    uid: str = ""
    annotations: Mapping[str, str] = field(default_factory=empty)  # decision, rebalancing and explained only
    labels: Mapping[str, str] = field(default_factory=empty)  # gang, member-index and IMEX-group only
    owners: tuple[OwnerRef, ...] = ()  # owner references to GpuGangs and to Pods
    deleting: bool = False  # deletionTimestamp is set
    created: str | None = None  # creationTimestamp, kept while unallocated or labelled for an IMEX group
    requests: tuple[Mapping[str, Any], ...] = ()
    allocated: bool = False  # status.allocation is set (by any driver)
    results: tuple[DeviceResult, ...] = ()  # this driver's devices in the allocation
    reserved_for: tuple[Consumer, ...] = ()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def gang(self) -> str | None:
        """``ns/name`` of the GpuGang (of gpuplane's API group) owning the claim, if any."""
        for ref in self.owners:
            if ref.kind == names.GANG_KIND and ref.api_version.startswith(names.GROUP + "/"):
                return f"{self.namespace}/{ref.name}"
        return None

    @property
    def member_index(self) -> int:
        """The gang member index recorded on the claim (0 when absent or not a number)."""
        raw = self.labels.get(names.LABEL_MEMBER_INDEX, "0")
        return int(raw) if raw.isdigit() else 0

    @property
    def pod_owners(self) -> tuple[OwnerRef, ...]:
        """Its owner references to Pods (a template member's claim is owned by its pod)."""
        return tuple(r for r in self.owners if r.kind == "Pod")

    @property
    def decision(self) -> str:
        """The controller's placement decision annotation ("" when none)."""
        return self.annotations.get(names.ANNOTATION_DECISION, "")

    def spec(self) -> dict[str, Any]:
        """Its ``spec`` in the API's shape (only the requests): for readers that take a claim spec."""
        return {"devices": {"requests": list(self.requests)}}


def _owner(r: Mapping[str, Any]) -> OwnerRef | None:
    kind = r.get("kind")
    if kind not in (names.GANG_KIND, "Pod"):
        return None
    get = r.get
    return OwnerRef(str(kind), text(get("name")), text(get("uid")), text(get("apiVersion")), get("controller") is True)


def _consumer(r: Mapping[str, Any], owners: tuple[OwnerRef, ...]) -> Consumer:
    """A reservedFor entry; the pod's name and uid shared with its owner reference when they are equal (a
    template member's claim is reserved for the pod that owns it): one copy of each string, not two."""
    name, uid = text(r.get("name")), text(r.get("uid"))
    for o in owners:
        if o.uid == uid and o.name == name:
            name, uid = o.name, o.uid
            break
    return Consumer(_i(text(r.get("resource"))), name, uid)


def claim(body: Mapping[str, Any], driver: str = dn.DRIVER_NAME) -> ClaimView:
    """The indexed form of a ResourceClaim. Total on any body: a field of the wrong type reads as absent."""
    meta, status = mapping(body.get("metadata")), mapping(body.get("status"))
    labels = mapping(meta.get("labels"))
    allocation = status.get("allocation")
    created = meta.get("creationTimestamp")
    keep_created = (not allocation or imex_group.LABEL in labels) and isinstance(created, str)  # explainer; IMEX
    # Requests as written: small (the API caps them), and steering reads any field of them.
    raw = list(mappings(mapping(mapping(body.get("spec")).get("devices")).get("requests")))
    requests = REQUESTS(tuple(copy.deepcopy(raw))) if raw else ()
    results = tuple(
        DeviceResult(
            request=_i(text(r.get("request"))),
            pool=_i(text(r.get("pool"))),
            device=_i(text(r.get("device"))),
            share_percent=_i(mapping(r.get("consumedCapacity")).get(dn.CAP_SHARE_PERCENT)),
        )
        for r in mappings(mapping(mapping(allocation).get("devices")).get("results"))
        if r.get("driver") == driver
    )
    owners = tuple(o for o in map(_owner, mappings(meta.get("ownerReferences"))) if o is not None)
    return ClaimView(
        name=str(meta.get("name") or ""),
        namespace=_i(str(meta.get("namespace") or "")),
        uid=str(meta.get("uid") or ""),
        annotations=strings(mapping(meta.get("annotations")), _ANNOTATIONS),
        labels=strings(labels, (names.LABEL_MEMBER_INDEX, names.LABEL_GANG, imex_group.LABEL)),
        owners=owners,
        deleting=bool(meta.get("deletionTimestamp")),
        created=created if keep_created else None,
        requests=requests,
        allocated=bool(allocation),
        results=results,
        reserved_for=tuple(_consumer(r, owners) for r in mappings(status.get("reservedFor"))),
    )


@dataclass(frozen=True, slots=True)
class NodeView:
    """A Node as the controller reads it: parsed once, at the informer, into what it uses; read-only."""

    name: str
    uid: str = ""
    schedulable: bool = False  # Ready and not cordoned
    labels: Mapping[str, str] = field(default_factory=empty)  # every label
    nvlink_domains: str | None = None  # the annotation gpuplane.dev/nvlink-domains the controller maintains
    address: str = ""  # its first InternalIP (its IMEX daemon's address); "" when it reports none


def node(body: Mapping[str, Any]) -> NodeView:
    """The indexed form of a Node."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (body.get("status") or {}).get("conditions") or []
    )
    annotations = meta.get("annotations") or {}
    domains = annotations.get(names.ANNOTATION_NVLINK_DOMAINS)
    labels = {sys.intern(str(k)): sys.intern(str(v)) for k, v in (meta.get("labels") or {}).items()}
    return NodeView(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        schedulable=bool(ready and not spec.get("unschedulable")),
        labels=MappingProxyType(labels),  # interned: a fleet's nodes share most label keys and values
        nvlink_domains=domains if isinstance(domains, str) else None,
        address=internal_ip(body),
    )


def internal_ip(body: Mapping[str, Any]) -> str:
    """The Node's first ``InternalIP`` (its IMEX daemon's address), "" when it reports none."""
    for entry in (body.get("status") or {}).get("addresses") or []:
        if isinstance(entry, Mapping) and entry.get("type") == "InternalIP" and isinstance(entry.get("address"), str):
            return str(entry["address"])[: imex.MAX_ADDRESS]
    return ""


MAX_OWN_ANNOTATION = 1024  # longer values of a gpuplane.dev/ key are not gpuplane's and are dropped
# The API's limit on all of a pod's annotations (keys and values, bytes), less room for steering's own two
# (the result is cut to 250 characters, a placement is a few dozen): a pod above it cannot be steered.
ANNOTATIONS_FULL = 256 * 1024 - 2048


def annotation_bytes(annotations: Any) -> int:
    """The size the API server checks against its 256 KiB limit: every key's and value's bytes."""
    if not isinstance(annotations, Mapping):
        return 0
    return sum(len(str(k).encode()) + len(v.encode() if isinstance(v, str) else b"") for k, v in annotations.items())


@dataclass(frozen=True, slots=True)
class PodClaimRef:
    """One entry of a pod's ``spec.resourceClaims``: a claim by name, or a template its claim is made from."""

    name: str
    claim: str = ""  # resourceClaimName
    template: str = ""  # resourceClaimTemplateName


@dataclass(frozen=True, slots=True)
class PodView:
    """An unbound pod with a claim as steering and the MIG offer read it: parsed once, at the informer.

    Nothing a tenant can inflate: gpuplane's own annotation keys only (each at most ``MAX_OWN_ANNOTATION``
    characters) and the size of all of them; the affinity as written, because steering writes it back whole.
    """

    name: str
    namespace: str = ""
    uid: str = ""
    node_name: str = ""
    gates: tuple[str, ...] = ()  # spec.schedulingGates, in order
    claims: tuple[PodClaimRef, ...] = ()  # spec.resourceClaims
    node_selector: Mapping[str, str] = field(default_factory=empty)
    affinity: Mapping[str, Any] | None = None  # spec.affinity as written (read-only; steering copies it)
    annotations: Mapping[str, str] | None = None  # gpuplane's keys; None when the pod has no annotation at all
    annotation_bytes: int = 0  # the size the API counts of all its annotations

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def annotations_full(self) -> bool:
        """Whether the pod has no room left for steering's annotations."""
        return self.annotation_bytes > ANNOTATIONS_FULL


def pending_pod(body: Mapping[str, Any]) -> PodView:
    """The indexed form of an unbound pod with a claim: what steering reads, nothing a tenant can inflate.

    Its identity, the spec fields steering decides and patches on (the claims, the gates, the node
    selector and the affinity it rewrites), the size of all its annotations (steering leaves alone a
    pod whose annotations leave no room for its own), and only gpuplane's own annotation keys, each at
    most ``MAX_OWN_ANNOTATION`` characters: a pod's owner may write 256 KiB of annotations and a large
    spec (containers, volumes, env), and every pending pod is held here until it is bound. Total on any body.
    """
    meta, spec = mapping(body.get("metadata")), mapping(body.get("spec"))
    annotations = meta.get("annotations")
    own = {
        str(k): v
        for k, v in mapping(annotations).items()
        if str(k).startswith(names.GROUP + "/") and isinstance(v, str) and len(v) <= MAX_OWN_ANNOTATION
    }
    selector = {str(k): str(v) for k, v in mapping(spec.get("nodeSelector")).items()}
    affinity = spec.get("affinity")
    return PodView(
        name=str(meta.get("name") or ""),
        namespace=_i(str(meta.get("namespace") or "")),
        uid=str(meta.get("uid") or ""),
        node_name=str(spec.get("nodeName") or ""),
        gates=tuple(str(g.get("name", "")) for g in mappings(spec.get("schedulingGates"))),
        claims=tuple(
            PodClaimRef(
                str(r.get("name") or ""),
                str(r.get("resourceClaimName") or ""),
                str(r.get("resourceClaimTemplateName") or ""),
            )
            for r in mappings(spec.get("resourceClaims"))
        ),
        node_selector=MappingProxyType(selector) if selector else EMPTY,
        affinity=copy.deepcopy(dict(affinity)) if isinstance(affinity, Mapping) else None,
        # present even when none is ours: a patch then adds keys, not the map
        annotations=MappingProxyType(own) if annotations else None,
        annotation_bytes=annotation_bytes(annotations),
    )


def plain(body: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    """``body``'s apiVersion, kind, metadata and ``keys``, as they are (not copied: index entries are read-only)."""
    return {k: body[k] for k in ("apiVersion", "kind", "metadata", *keys) if k in body}


def single(index: Mapping[Any, Iterable[Any]]) -> dict[Any, Any]:
    """A kopf index whose keys each hold one value, as a plain dict (the first value of each key)."""
    out: dict[Any, Any] = {}
    for key, store in index.items():
        for value in store:
            out[key] = value
            break
    return out
