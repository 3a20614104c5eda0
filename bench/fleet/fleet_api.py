"""Fleet benchmark, measurement 2: what the fleet's ResourceSlices cost kube-apiserver and etcd.

* ``slice_footprint``: the slices as the API serves them (objects, devices, JSON bytes; listed
  in pages) and as etcd stores them (keys and bytes under ``/registry/resourceslices/``,
  read through etcd's JSON gateway), with etcd's database size.
* ``republish``: one publish pass of every node's driver after a health change (a fatal Xid
  on one GPU of every node, as the driver's health watcher reports it) or after it clears,
  with a watch on ResourceSlices in this process counting the events and bytes one watcher
  receives per second, the API server's request counts for ResourceSlices and the watch events
  it sent to all its watchers (``apiserver_watch_events_total`` / ``_sizes``).
* ``memory``: resident memory of every component.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client

from bench.dra import dra_watch
from bench.fleet import fleet_probe
from e2e.plane import fleetslices
from gpuplane.driver.observe import health
from gpuplane.driver.publish.slices import DeviceTaint

Printer = Callable[[str], None]
GROUP, VERSION = "resource.k8s.io", "v1"
ETCD_PREFIX = "/registry/resourceslices/"
HEALTH_GPU = "gpu-3"
HEALTH_XID = 94  # contained ECC error: fatal, NoSchedule


@dataclasses.dataclass(frozen=True)
class Footprint:
    """The slices as served and as stored."""

    objects: int
    devices: int
    json_bytes: int
    etcd_keys: int
    etcd_bytes: int
    etcd_db_bytes: float
    etcd_db_in_use_bytes: float


def slice_footprint(api: client.ApiClient, probe: fleet_probe.Probe) -> Footprint:
    """Count and size the ResourceSlices (API, etcd, the API server's storage metric)."""
    custom = client.CustomObjectsApi(api)
    objects = devices = size = 0
    token: str | None = None
    while True:
        page: dict[str, Any] = custom.list_cluster_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, "resourceslices", limit=500, _continue=token
        )
        for item in page.get("items", []):
            objects += 1
            devices += len((item.get("spec") or {}).get("devices") or [])
            size += len(json.dumps(item, separators=(",", ":")))
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            break
    keys, stored = probe.etcd_prefix_bytes(ETCD_PREFIX)
    etcd = probe.etcd()
    return Footprint(
        objects=objects,
        devices=devices,
        json_bytes=size,
        etcd_keys=keys,
        etcd_bytes=stored,
        etcd_db_bytes=etcd.total("etcd_mvcc_db_total_size_in_bytes"),
        etcd_db_in_use_bytes=etcd.total("etcd_mvcc_db_total_size_in_use_in_bytes"),
    )


class SliceEventWatch(dra_watch._Watch):
    """Every ResourceSlice watch event this process receives: per-second counts and bytes."""

    def __init__(self, api: client.ApiClient) -> None:
        custom = client.CustomObjectsApi(api)
        super().__init__(lambda **kw: custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices", **kw))
        self.lock = threading.Lock()
        self.events: list[tuple[float, str, int]] = []  # (arrival, type, bytes)

    def _event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        with self.lock:
            self.events.append((now, kind, len(json.dumps(obj, separators=(",", ":")))))

    def between(self, start: float, end: float) -> list[tuple[float, str, int]]:
        """Events that arrived in [start, end]."""
        with self.lock:
            return [e for e in self.events if start <= e[0] <= end]


@dataclasses.dataclass(frozen=True)
class Republish:
    """One fleet-wide publish pass and what the API server made of it."""

    what: str
    nodes: int
    nodes_written: int
    seconds: float
    calls: Mapping[str, int]
    events: int
    event_bytes: int
    events_per_s: float
    peak_events_per_s: int
    mb_per_s: float
    server_requests: Mapping[str, float]
    server_watch_events: float
    server_watch_bytes: float
    server_cpu_s: float  # kube-apiserver + etcd CPU seconds during the pass


def xid_taints(node: str) -> dict[str, list[DeviceTaint]]:
    """What the health watcher reports for a fatal Xid on ``HEALTH_GPU``: one NoSchedule taint on that GPU."""
    del node
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        HEALTH_GPU: [DeviceTaint(key=health.KEY_XID, value=f"xid-{HEALTH_XID}", effect="NoSchedule", time_added=now)]
    }


def republish(
    slices: fleetslices.FleetSlices,
    api: client.ApiClient,
    probe: fleet_probe.Probe,
    *,
    what: str,
    taints: Callable[[str], Mapping[str, Sequence[DeviceTaint]]],
    settle_s: float = 5.0,
) -> Republish:
    """Set every node's taints, run one publish pass, and count what the API server did and sent."""
    watch = SliceEventWatch(api)
    watch.start()
    for node in slices.pools:
        slices.set_taints(node, taints(node))
    server_before = probe.apiserver()
    pids = probe.pids()

    def server_cpu() -> float:
        return sum(fleet_probe.cpu_s(pids.get(c, 0)) for c in ("kube-apiserver", "etcd"))

    cpu_before = server_cpu()
    started = time.monotonic()
    done = slices.publish(what=what)
    ended = time.monotonic()
    # Let the last events arrive: wait until none came for a second (at most settle_s).
    deadline = ended + settle_s
    while time.monotonic() < deadline:
        recent = watch.between(time.monotonic() - 1.0, time.monotonic())
        if not recent:
            break
        time.sleep(0.2)
    cpu_after = server_cpu()
    server_after = probe.apiserver()
    watch.stop()
    events = watch.between(started, time.monotonic())
    span = (max(e[0] for e in events) - started) if events else (ended - started)
    per_second: dict[int, int] = {}
    for arrival, _, _ in events:
        per_second[int(arrival - started)] = per_second.get(int(arrival - started), 0) + 1
    delta = server_after.minus(server_before)
    requests = {
        verb: delta.total("apiserver_request_total", resource="resourceslices", verb=verb)
        for verb in ("LIST", "GET", "POST", "PUT", "PATCH", "DELETE", "WATCH")
    }
    return Republish(
        what=what,
        nodes=done.nodes,
        nodes_written=done.written,
        seconds=done.seconds,
        calls=done.calls,
        events=len(events),
        event_bytes=sum(e[2] for e in events),
        events_per_s=len(events) / span if span > 0 else 0.0,
        peak_events_per_s=max(per_second.values(), default=0),
        mb_per_s=sum(e[2] for e in events) / span / 1e6 if span > 0 else 0.0,
        server_requests={k: v for k, v in requests.items() if v},
        server_watch_events=delta.total("apiserver_watch_events_total", resource="resourceslices"),
        server_watch_bytes=delta.total("apiserver_watch_events_sizes_sum", resource="resourceslices"),
        server_cpu_s=cpu_after - cpu_before,
    )


def memory(probe: fleet_probe.Probe) -> dict[str, float]:
    """Component -> resident MB now."""
    return {name: fleet_probe.rss_mb(pid) for name, pid in sorted(probe.pids().items())}


def footprint_table(rows: Sequence[tuple[str, Footprint]]) -> str:
    """Markdown table of slice footprints."""
    out = [
        "| fleet | slices | devices | JSON MB (as served) | etcd keys | etcd MB (stored) | etcd db MB "
        "| etcd db in use MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, f in rows:
        out.append(
            f"| {label} | {f.objects} | {f.devices} | {f.json_bytes / 1e6:.1f} | {f.etcd_keys} | "
            f"{f.etcd_bytes / 1e6:.1f} | {f.etcd_db_bytes / 1e6:.0f} | "
            f"{f.etcd_db_in_use_bytes / 1e6:.0f} |"
        )
    return "\n".join(out) + "\n"


def republish_table(rows: Sequence[Republish]) -> str:
    """Markdown table of publish passes."""
    out = [
        "| pass | nodes | nodes written | pass s | publisher calls | events (1 watcher) | events/s | peak/s | "
        "MB/s to 1 watcher | apiserver requests | watch events sent (all watchers) | MB sent | "
        "apiserver+etcd CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        calls = ", ".join(f"{k} {v}" for k, v in sorted(r.calls.items())) or "none"
        server = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.server_requests.items())) or "none"
        out.append(
            f"| {r.what} | {r.nodes} | {r.nodes_written} | {r.seconds:.1f} | {calls} | {r.events} | "
            f"{r.events_per_s:.0f} | {r.peak_events_per_s} | {r.mb_per_s:.1f} | {server} | "
            f"{r.server_watch_events:.0f} | {r.server_watch_bytes / 1e6:.0f} | {r.server_cpu_s:.1f} |"
        )
    return "\n".join(out) + "\n"


def memory_table(columns: Sequence[tuple[str, Mapping[str, float]]]) -> str:
    """Markdown table: component x moment -> RSS MB."""
    components = sorted({c for _, m in columns for c in m})
    out = ["| component | " + " | ".join(label for label, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    for c in components:
        out.append(f"| {c} | " + " | ".join(f"{m[c]:.0f}" if c in m else "" for _, m in columns) + " |")
    return "\n".join(out) + "\n"
