"""Keep this node's ResourceSlices equal to the desired pool.

Only slices with ``spec.nodeName == <node>`` and ``spec.driver == <driver>`` are
ever read, written or deleted. The pool generation rises whenever the content
changes; new-generation slices are written before stale ones are deleted, so the
scheduler never sees a pool with fewer devices than it has. One exception: when
the only change is the order of devices inside slices (the steered layout
re-ranking after a prepare), each such slice is rewritten in place at the same
generation. Every device stays in its slice with the same spec, so at every
moment the pool is complete, valid and holds the same devices; no other slice
is touched.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from gpuplane.driver.publish import slices
from gpuplane.driver.publish.inventory import Inventory

log = structlog.get_logger(__name__)


class SliceApi(Protocol):
    def list_slices(self, node_name: str, driver_name: str) -> list[dict[str, Any]]: ...

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def delete_slice(self, name: str) -> None: ...


def _fingerprint(specs: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(list(specs), sort_keys=True)


def _without_time_added(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with its device taints' ``timeAdded`` removed: the API server fills it in where the driver
    leaves it out, so a slice read back never equals the one written while a device is tainted."""
    out = dict(spec)
    devices = []
    for device in spec.get("devices") or []:
        taints = device.get("taints")
        if taints:
            devices.append({**device, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in taints]})
        else:
            devices.append(device)
    if "devices" in spec:
        out["devices"] = devices
    return out


def _same_specs(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Equal slice specs regardless of order (the API lists slices by name: "-10" sorts before "-2") and of
    the taints' ``timeAdded`` (defaulted by the API server)."""

    def keys(specs: Sequence[Mapping[str, Any]]) -> list[str]:
        return sorted(json.dumps(_without_time_added(s), sort_keys=True) for s in specs)

    return keys(a) == keys(b)


def _spec_without_pool(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec = dict(obj.get("spec", {}))
    spec.pop("pool", None)
    return spec


def _unordered(spec: Mapping[str, Any]) -> str:
    """A slice spec with its devices sorted by name: equal for two specs that differ only in device order."""
    out = dict(spec)
    out["devices"] = sorted(spec.get("devices") or [], key=lambda d: str(d.get("name", "")))
    return json.dumps(out, sort_keys=True)


def _keep_taint_times(spec: dict[str, Any], have: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with each taint's missing ``timeAdded`` taken from the same device's taint in ``have``.

    The API server sets ``timeAdded`` when a write leaves it out, so without this a slice we wrote
    never compares equal to what we want, and a rewrite would restamp every taint.
    """
    times: dict[tuple[str, str, str, str], str] = {}
    for d in have.get("devices") or []:
        for t in d.get("taints") or []:
            if t.get("timeAdded"):
                times[(d.get("name", ""), t.get("key", ""), t.get("value", ""), t.get("effect", ""))] = t["timeAdded"]
    devices = []
    for dev in spec.get("devices") or []:
        taints = dev.get("taints")
        devices.append({**dev, "taints": [_stamped(dev.get("name", ""), t, times) for t in taints]} if taints else dev)
    return {**spec, "devices": devices} if "devices" in spec else spec


def _stamped(device: str, t: Mapping[str, Any], times: Mapping[tuple[str, str, str, str], str]) -> dict[str, Any]:
    if t.get("timeAdded"):
        return dict(t)
    when = times.get((device, t.get("key", ""), t.get("value", ""), t.get("effect", "")))
    return {**t, "timeAdded": when} if when else dict(t)


Layout = Callable[[Inventory, Mapping[str, Sequence[slices.DeviceTaint]]], slices.PoolContent]


class SlicePublisher:
    """Publishes the pool; call :meth:`publish` with every new inventory (cheap when unchanged)."""

    def __init__(
        self,
        api: SliceApi,
        node_name: str,
        driver_name: str,
        taints: Callable[[], Mapping[str, Sequence[slices.DeviceTaint]]] | None = None,
        *,
        layout: Layout | None = None,
        on_write: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.driver_name = driver_name
        self.taints = taints or (lambda: {})
        self.layout: Layout = layout or (lambda inv, t: slices.build_pool(inv, driver_name, t))
        self.on_write = on_write or (lambda verb: None)
        self._lock = threading.Lock()
        self._published: str | None = None
        self._generation = 0
        self.devices_published = 0
        self.writes = {"create": 0, "replace": 0, "reorder": 0, "delete": 0}

    def _wrote(self, verb: str) -> None:
        self.writes[verb] += 1
        self.on_write(verb)

    def publish(self, inventory: Inventory, force: bool = False) -> bool:
        """Bring the API in line with the inventory. Returns True when something was written."""
        content = self.layout(inventory, self.taints())
        desired = _fingerprint(content.slice_specs)
        with self._lock:
            if desired == self._published and not force:
                return False
            existing = sorted(
                self.api.list_slices(self.node_name, self.driver_name), key=lambda o: o["metadata"]["name"]
            )
            current_gen = max((int(o["spec"]["pool"].get("generation", 0)) for o in existing), default=0)
            self._generation = max(self._generation, current_gen)
            if (
                existing
                and _same_specs([_spec_without_pool(o) for o in existing], content.slice_specs)
                and all(o["spec"]["pool"].get("resourceSliceCount") == len(existing) for o in existing)
                and len({o["spec"]["pool"].get("generation") for o in existing}) == 1
            ):
                self._published = desired
                self._count(content)
                return False
            if self._reorder_in_place(existing, content):
                self._published = desired
                self._count(content)
                return True
            self._generation += 1
            objs = slices.render_slices(content, self._generation, self.driver_name)
            slices.validate_pool(objs)
            by_name = {o["metadata"]["name"]: o for o in existing}
            for obj in objs:
                name = obj["metadata"]["name"]
                if name in by_name:
                    body = dict(obj)
                    body["metadata"] = {
                        **obj["metadata"],
                        "resourceVersion": by_name[name]["metadata"]["resourceVersion"],
                    }
                    self.api.replace_slice(name, body)
                    self._wrote("replace")
                else:
                    self.api.create_slice(obj)
                    self._wrote("create")
            wanted = {o["metadata"]["name"] for o in objs}
            for name in by_name:
                if name not in wanted:
                    self.api.delete_slice(name)
                    self._wrote("delete")
            self._published = desired
            self._count(content)
            log.info(
                "published ResourceSlices",
                node=self.node_name,
                slices=len(objs),
                generation=self._generation,
                devices=self.devices_published,
            )
            return True

    def _reorder_in_place(self, existing: list[dict[str, Any]], content: slices.PoolContent) -> bool:
        """Rewrite the slices whose device order changed, at the same generation, if that is all that changed."""
        if not existing or len(existing) != len(content.slice_specs):
            return False
        gens = {int(o["spec"]["pool"].get("generation", 0)) for o in existing}
        if len(gens) != 1 or any(o["spec"]["pool"].get("resourceSliceCount") != len(existing) for o in existing):
            return False
        generation = gens.pop()
        objs = slices.render_slices(content, generation, self.driver_name)
        by_name = {o["metadata"]["name"]: o for o in existing}
        changed: list[dict[str, Any]] = []
        for obj in objs:
            have = by_name.get(obj["metadata"]["name"])
            if have is None:
                return False
            got = _spec_without_pool(have)
            want = _keep_taint_times(_spec_without_pool(obj), got)
            if _unordered(want) != _unordered(got):
                return False
            if json.dumps(want, sort_keys=True) != json.dumps(got, sort_keys=True):
                changed.append({**obj, "spec": {**want, "pool": obj["spec"]["pool"]}})
        slices.validate_pool(objs)
        for obj in changed:
            name = obj["metadata"]["name"]
            body = dict(obj)
            body["metadata"] = {**obj["metadata"], "resourceVersion": by_name[name]["metadata"]["resourceVersion"]}
            self.api.replace_slice(name, body)
            self._wrote("reorder")
        self._generation = max(self._generation, generation)
        if changed:
            log.debug("reordered ResourceSlices in place", node=self.node_name, slices=len(changed))
        return True

    def _count(self, content: slices.PoolContent) -> None:
        self.devices_published = sum(len(s.get("devices") or []) for s in content.slice_specs)

    def unpublish(self) -> None:
        with self._lock:
            for obj in self.api.list_slices(self.node_name, self.driver_name):
                self.api.delete_slice(obj["metadata"]["name"])
            self._published = None
