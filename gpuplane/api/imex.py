"""The IMEX plan object (``ImexDomain``, ``gpuplane.dev/v1alpha1``): what the controller tells each node's driver.

Tenants write claims and pods, so a claim cannot carry its IMEX channel (a tenant would name another gang's
channel). The controller writes one ``ImexDomain`` per domain in ``gpuplane-system``, where only it may write
(``manifests/controller/rbac.yaml``); the driver reads them and prepares a claim with a channel only when one
names that claim on its node (:func:`claims_on`). ``spec.addresses`` gives each node's InternalIP as the
controller read it from the Node (a node's ``nvidia-imex`` binds its own and lists all of them, in node-name
order, in its node file; a node without one gets no daemon). The driver reports its daemon's readiness per
node in the status.

The parser is strict because the object is input to a privileged program: wrong types, unknown fields, a
channel outside 1..``IMEX_CHANNEL_COUNT``-1, a channel twice in one domain, a claim on a node not in the
domain, a claim outside its gang's namespace, and sizes past the bounds below are each refused with a
message naming the field, and nothing is returned. The CRD's schema (``crds/gpuplane.dev_imexdomains.yaml``)
carries the same bounds (``tests/unit/controller/imex/test_imex_plan_object.py`` compares them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import names

GROUP = "gpuplane.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ImexDomain"
PLURAL = "imexdomains"
NAMESPACE = "gpuplane-system"

MIN_CHANNEL = 1  # 0 is NVIDIA's channel for everyone: never handed out
MAX_CHANNEL = names.IMEX_CHANNEL_COUNT - 1
MIN_NODES = 2  # a gang inside one node needs no IMEX
MAX_NODES = 72  # an NVL72 clique: 72 GPUs, so never more nodes than that
MAX_GANGS = 36  # a multi-node gang holds at least two of the clique's 72 GPUs
MAX_CLAIMS = 512  # per gang: 72 GPUs of 7 MIG slices each at most
MAX_OBJECT_NAME = 63  # metadata.name: a DNS label ("imex-" + the oldest gang's uid)
MAX_CLIQUE = 64  # a DRA string attribute's limit (the nvlinkDomain attribute)
MAX_NODE_NAME = 253
MAX_NAMESPACE = 63
MAX_NAME = 253
MAX_UID = 64  # a Kubernetes uid is 36 characters
MAX_MESSAGE = 1024
MAX_GENERATION = 2**63 - 1

MAX_ADDRESS = 45  # an IPv6 address's longest text form

SPEC_REQUIRED = frozenset({"clique", "nodes", "gangs"})
SPEC_FIELDS = SPEC_REQUIRED | {"addresses"}
ADDRESS_FIELDS = frozenset({"node", "address"})
GANG_FIELDS = frozenset({"namespace", "name", "uid", "channel", "claims"})
CLAIM_FIELDS = frozenset({"namespace", "name", "uid", "node"})
NODE_STATUS_FIELDS = frozenset({"node", "ready", "message", "observedGeneration"})


@dataclass(frozen=True)
class Claim:
    """One member claim of a gang: the driver of ``node`` prepares it with the gang's channel."""

    namespace: str
    name: str
    uid: str
    node: str


@dataclass(frozen=True)
class Gang:
    """A gang in the domain: its channel (the same index on every node) and its member claims."""

    namespace: str
    name: str
    uid: str
    channel: int
    claims: tuple[Claim, ...]


@dataclass(frozen=True)
class NodeStatus:
    """One node's daemon as its driver reports it: ready for ``observedGeneration`` of the spec."""

    node: str
    ready: bool
    message: str = ""
    observedGeneration: int = 0


@dataclass(frozen=True)
class ImexDomain:
    """One ``ImexDomain`` object: the spec the controller writes and the status the drivers write."""

    name: str
    generation: int
    clique: str
    nodes: tuple[str, ...]  # sorted
    gangs: tuple[Gang, ...]
    status: tuple[NodeStatus, ...] = ()
    addresses: tuple[tuple[str, str], ...] = ()  # (node, InternalIP), sorted by node; nodes without one absent

    def address_of(self, node: str) -> str:
        """The node's address in the spec, "" when it has none."""
        return dict(self.addresses).get(node, "")


@dataclass(frozen=True)
class ClaimImex:
    """What the driver of one node needs for one claim: the domain, the channel, the domain's nodes."""

    domain: str
    channel: int
    nodes: tuple[str, ...]  # every node of the domain, this one included, sorted (the daemon's node file)
    node: str

    @property
    def peers(self) -> tuple[str, ...]:
        """The domain's other nodes."""
        return tuple(n for n in self.nodes if n != self.node)


@dataclass(frozen=True)
class NodePlan:
    """The claims of one node that have a channel, and the claims refused with why."""

    claims: Mapping[str, ClaimImex]
    refused: Mapping[str, str]


class _Bad(Exception):
    """The first thing wrong with the object, as ``path: what``."""


def _dict(value: Any, path: str, fields: frozenset[str] | None = None, required: Iterable[str] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{path}: must be an object, not {type(value).__name__}")
    if fields is not None:
        unknown = sorted(str(k) for k in value if k not in fields)
        if unknown:
            raise _Bad(f"{path}: unknown field(s) {', '.join(repr(u[:64]) for u in unknown[:5])}")
    for key in required:
        if key not in value:
            raise _Bad(f"{path}.{key}: required")
    return value


def _str(value: Any, path: str, max_len: int) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{path}: must be a string, not {type(value).__name__}")
    if not value:
        raise _Bad(f"{path}: must not be empty")
    if len(value) > max_len:
        raise _Bad(f"{path}: {len(value)} characters, at most {max_len}")
    return value


def _int(value: Any, path: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"{path}: must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise _Bad(f"{path}: {value} is not in {low}..{high}")
    return value


def _list(value: Any, path: str, low: int, high: int) -> list[Any]:
    if not isinstance(value, list):
        raise _Bad(f"{path}: must be a list, not {type(value).__name__}")
    if not low <= len(value) <= high:
        raise _Bad(f"{path}: {len(value)} entries, must be {low}..{high}")
    return value


def _claim(value: Any, path: str, gang_namespace: str, nodes: frozenset[str]) -> Claim:
    raw = _dict(value, path, CLAIM_FIELDS, sorted(CLAIM_FIELDS))
    claim = Claim(
        namespace=_str(raw["namespace"], f"{path}.namespace", MAX_NAMESPACE),
        name=_str(raw["name"], f"{path}.name", MAX_NAME),
        uid=_str(raw["uid"], f"{path}.uid", MAX_UID),
        node=_str(raw["node"], f"{path}.node", MAX_NODE_NAME),
    )
    if claim.namespace != gang_namespace:
        raise _Bad(f"{path}.namespace: {claim.namespace!r} is not the gang's namespace {gang_namespace!r}")
    if claim.node not in nodes:
        raise _Bad(f"{path}.node: {claim.node!r} is not one of the domain's nodes")
    return claim


def _gang(value: Any, path: str, nodes: frozenset[str]) -> Gang:
    raw = _dict(value, path, GANG_FIELDS, sorted(GANG_FIELDS))
    namespace = _str(raw["namespace"], f"{path}.namespace", MAX_NAMESPACE)
    name = _str(raw["name"], f"{path}.name", MAX_NAME)
    uid = _str(raw["uid"], f"{path}.uid", MAX_UID)
    channel = _int(raw["channel"], f"{path}.channel", MIN_CHANNEL, MAX_CHANNEL)
    claims = _list(raw["claims"], f"{path}.claims", 1, MAX_CLAIMS)
    parsed = tuple(_claim(c, f"{path}.claims[{i}]", namespace, nodes) for i, c in enumerate(claims))
    return Gang(namespace, name, uid, channel, parsed)


def _addresses(value: Any, nodes: frozenset[str]) -> tuple[tuple[str, str], ...]:
    entries = _list(value, "spec.addresses", 0, MAX_NODES)
    out: dict[str, str] = {}
    for i, entry in enumerate(entries):
        path = f"spec.addresses[{i}]"
        raw = _dict(entry, path, ADDRESS_FIELDS, sorted(ADDRESS_FIELDS))
        node = _str(raw["node"], f"{path}.node", MAX_NODE_NAME)
        address = _str(raw["address"], f"{path}.address", MAX_ADDRESS)
        if node not in nodes:
            raise _Bad(f"{path}.node: {node!r} is not one of the domain's nodes")
        if node in out:
            raise _Bad(f"{path}.node: {node!r} listed twice")
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            raise _Bad(f"{path}.address: {address!r} is not an IP address") from None
        if str(parsed) != address:
            raise _Bad(f"{path}.address: {address!r} is not in canonical form ({parsed})")
        if address in out.values():
            raise _Bad(f"{path}.address: {address!r} is also another node's")
        out[node] = address
    return tuple(sorted(out.items()))


Spec = tuple[str, tuple[str, ...], tuple[Gang, ...], tuple[tuple[str, str], ...]]


def _spec(value: Any) -> Spec:
    raw = _dict(value, "spec", SPEC_FIELDS, sorted(SPEC_REQUIRED))
    clique = _str(raw["clique"], "spec.clique", MAX_CLIQUE)
    node_list = _list(raw["nodes"], "spec.nodes", MIN_NODES, MAX_NODES)
    nodes = [_str(n, f"spec.nodes[{i}]", MAX_NODE_NAME) for i, n in enumerate(node_list)]
    if len(set(nodes)) != len(nodes):
        raise _Bad(f"spec.nodes: {next(n for n in nodes if nodes.count(n) > 1)!r} listed twice")
    node_set = frozenset(nodes)
    gang_list = _list(raw["gangs"], "spec.gangs", 1, MAX_GANGS)
    gangs = tuple(_gang(g, f"spec.gangs[{i}]", node_set) for i, g in enumerate(gang_list))
    seen_gangs: dict[str, int] = {}
    seen_channels: dict[int, int] = {}
    seen_claims: dict[str, int] = {}
    for i, gang in enumerate(gangs):
        if gang.uid in seen_gangs:
            raise _Bad(f"spec.gangs[{i}].uid: {gang.uid!r} is also spec.gangs[{seen_gangs[gang.uid]}]'s")
        if gang.channel in seen_channels:
            other = seen_channels[gang.channel]
            raise _Bad(f"spec.gangs[{i}].channel: {gang.channel} is also spec.gangs[{other}]'s channel")
        seen_gangs[gang.uid] = seen_channels[gang.channel] = i
        for j, claim in enumerate(gang.claims):
            if claim.uid in seen_claims:
                raise _Bad(
                    f"spec.gangs[{i}].claims[{j}].uid: {claim.uid!r} is listed twice "
                    f"(also in spec.gangs[{seen_claims[claim.uid]}])"
                )
            seen_claims[claim.uid] = i
    addresses = _addresses(raw["addresses"], node_set) if "addresses" in raw else ()
    return clique, tuple(sorted(nodes)), gangs, addresses


def _status(value: Any) -> tuple[NodeStatus, ...]:
    raw = _dict(value, "status", frozenset({"nodes"}))
    entries = _list(raw.get("nodes", []), "status.nodes", 0, MAX_NODES)
    out: list[NodeStatus] = []
    for i, entry in enumerate(entries):
        path = f"status.nodes[{i}]"
        item = _dict(entry, path, NODE_STATUS_FIELDS, ("node", "ready"))
        ready = item["ready"]
        if not isinstance(ready, bool):
            raise _Bad(f"{path}.ready: must be a boolean, not {type(ready).__name__}")
        message = item.get("message", "")
        if message:
            message = _str(message, f"{path}.message", MAX_MESSAGE)
        elif not isinstance(message, str):
            raise _Bad(f"{path}.message: must be a string, not {type(message).__name__}")
        generation = _int(item.get("observedGeneration", 0), f"{path}.observedGeneration", 0, MAX_GENERATION)
        node = _str(item["node"], f"{path}.node", MAX_NODE_NAME)
        if any(s.node == node for s in out):
            raise _Bad(f"{path}.node: {node!r} reported twice")
        out.append(NodeStatus(node, ready, message, generation))
    return tuple(out)


def parse_domain(obj: Any) -> tuple[ImexDomain | None, str]:
    """(the object as a model, "") or (None, what is wrong with it, naming the field)."""
    try:
        raw = _dict(obj, "object", required=("metadata", "spec"))
        meta = _dict(raw["metadata"], "metadata", required=("name",))
        name = _str(meta["name"], "metadata.name", MAX_OBJECT_NAME)
        generation = _int(meta.get("generation", 0), "metadata.generation", 0, MAX_GENERATION)
        clique, nodes, gangs, addresses = _spec(raw["spec"])
        status = _status(raw["status"]) if raw.get("status") is not None else ()
    except _Bad as bad:
        return None, f"ImexDomain {_name_of(obj)}: {bad}"
    return ImexDomain(name, generation, clique, nodes, gangs, status, addresses), ""


def _name_of(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return repr(name[:MAX_OBJECT_NAME]) if isinstance(name, str) else "(no name)"


def domain_to_spec(domain: ImexDomain) -> dict[str, Any]:
    """The ``spec`` of ``domain`` as the API object carries it (the inverse of the parser's spec part)."""
    spec: dict[str, Any] = {
        "clique": domain.clique,
        "nodes": list(domain.nodes),
        "gangs": [
            {
                "namespace": g.namespace,
                "name": g.name,
                "uid": g.uid,
                "channel": g.channel,
                "claims": [{"namespace": c.namespace, "name": c.name, "uid": c.uid, "node": c.node} for c in g.claims],
            }
            for g in domain.gangs
        ],
    }
    if domain.addresses:
        spec["addresses"] = [{"node": n, "address": a} for n, a in domain.addresses]
    return spec


def claims_on(domains: Iterable[ImexDomain], node: str) -> NodePlan:
    """The claims on ``node`` that have a channel, by claim uid; conflicts refused, never guessed.

    A node runs one daemon, so it is in one domain: if two domains list ``node``, none of their claims on
    it gets a channel. A claim uid listed by two domains gets none either. Both are refused with why.
    """
    domains = sorted(domains, key=lambda d: d.name)
    here = [d for d in domains if node in d.nodes]
    refused: dict[str, str] = {}
    owners: dict[str, list[str]] = {}
    for domain in domains:
        for gang in domain.gangs:
            for claim in gang.claims:
                owners.setdefault(claim.uid, []).append(domain.name)
    claims: dict[str, ClaimImex] = {}
    node_conflict = len(here) > 1
    for domain in here:
        for gang in domain.gangs:
            for claim in gang.claims:
                if claim.node != node:
                    continue
                if node_conflict:
                    refused[claim.uid] = (
                        f"node {node} is in more than one IMEX domain ({', '.join(d.name for d in here)}); "
                        "a node runs one IMEX daemon"
                    )
                elif len(owners[claim.uid]) > 1:
                    refused[claim.uid] = (
                        f"claim {claim.namespace}/{claim.name} ({claim.uid}) is listed by more than one IMEX "
                        f"domain ({', '.join(owners[claim.uid])})"
                    )
                else:
                    claims[claim.uid] = ClaimImex(domain.name, gang.channel, domain.nodes, node)
    return NodePlan(claims, refused)
