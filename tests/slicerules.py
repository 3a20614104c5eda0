"""The ResourceSlice validation rules of resource.k8s.io/v1 (Kubernetes 1.36), restated for the tests.

Written independently of ``gpuplane/driver/publish/slices.py`` (its ``validate_pool``), so that a
bug shared by the slice builder and its own checker still fails a test. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN_PART = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def dns_label(name: str) -> bool:
    return len(name) <= 63 and DNS_LABEL.match(name) is not None


def dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and all(DNS_SUBDOMAIN_PART.match(p) and len(p) <= 63 for p in name.split("."))


def qualified_name_ok(key: str) -> bool:
    domain, sep, ident = key.rpartition("/")
    if sep and (not domain or len(domain) > 63 or not dns_subdomain(domain)):
        return False
    return len(ident) <= 32 and C_IDENTIFIER.match(ident) is not None


def api_violations(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every rule the brief lists, stated from the API docs rather than from gpuplane/driver/publish/slices.py."""
    out: list[str] = []
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    if len(generations) != 1:
        out.append(f"pool generations differ: {generations}")
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    if counts != {len(slices)}:
        out.append(f"resourceSliceCount {counts} != {len(slices)} slices")
    pools = {s["spec"]["pool"]["name"] for s in slices}
    if len(pools) != 1:
        out.append(f"several pools {pools}")
    all_devices: list[str] = []
    sets: dict[str, dict[str, int]] = {}
    for s in slices:
        spec = s["spec"]
        name = s["metadata"]["name"]
        devices = spec.get("devices") or []
        shared = spec.get("sharedCounters") or []
        if bool(devices) == bool(shared):
            out.append(f"{name}: must carry devices XOR sharedCounters")
        if len(shared) > 8:
            out.append(f"{name}: {len(shared)} counter sets > 8")
        for cs in shared:
            if not dns_label(cs["name"]):
                out.append(f"{name}: counter set name {cs['name']!r}")
            if not 0 < len(cs["counters"]) <= 32:
                out.append(f"{name}: counter set {cs['name']} has {len(cs['counters'])} counters")
            out.extend(f"{name}: counter {c!r}" for c in cs["counters"] if not dns_label(c))
            if cs["name"] in sets:
                out.append(f"counter set {cs['name']} twice")
            sets[cs["name"]] = {k: int(v["value"]) for k, v in cs["counters"].items()}
        advanced = any(d.get("consumesCounters") or d.get("taints") for d in devices)
        if len(devices) > (64 if advanced else 128):
            out.append(f"{name}: {len(devices)} devices (advanced={advanced})")
        for d in devices:
            dn = d["name"]
            all_devices.append(dn)
            if not dns_label(dn):
                out.append(f"device name {dn!r} is not a DNS label")
            attrs, caps = d.get("attributes", {}), d.get("capacity", {})
            if len(attrs) + len(caps) > 32:
                out.append(f"{dn}: {len(attrs) + len(caps)} attributes+capacities")
            out.extend(f"{dn}: name {k!r}" for k in [*attrs, *caps] if not qualified_name_ok(k))
            for k, v in attrs.items():
                if len(v) != 1 or next(iter(v)) not in ("int", "bool", "string", "version"):
                    out.append(f"{dn}: attribute {k} = {v}")
                    continue
                kind, value = next(iter(v.items()))
                if kind in ("string", "version") and len(value) > 64:
                    out.append(f"{dn}: attribute {k} longer than 64")
                if kind == "version" and not SEMVER.match(value):
                    out.append(f"{dn}: attribute {k} = {value!r} is not semver")
            consumes = d.get("consumesCounters") or []
            if len(consumes) > 2:
                out.append(f"{dn}: {len(consumes)} consumesCounters")
            for c in consumes:
                if len(c["counters"]) > 32:
                    out.append(f"{dn}: consumes {len(c['counters'])} counters")
    if len(all_devices) != len(set(all_devices)):
        out.append("duplicate device names in the pool")
    for s in slices:
        for d in s["spec"].get("devices") or []:
            for c in d.get("consumesCounters") or []:
                known = sets.get(c["counterSet"])
                if known is None or not set(c["counters"]) <= set(known):
                    out.append(f"{d['name']}: consumes undefined counters of {c['counterSet']}")
    return out
