"""Keep this node's ResourceSlices equal to the desired pool.

Only slices with ``spec.nodeName == <node>`` and ``spec.driver == <driver>`` are
ever read, written or deleted. One rule decides how a change is written. When the
pool keeps its slices (same names, one generation, complete) and at most one
slice's devices change (a health taint on one GPU: a GPU's devices share a slice),
while any other slice changes only in the order of its devices (the steered
layout re-ranking after a prepare), those slices are updated in place at the same
generation, as the upstream ResourceSlice controller does. One update is atomic
and a reorder moves no device out of its slice and changes no spec, so every
state a reader can see is the old pool or the new one. Any other change raises
the generation: new-generation slices are written before stale ones are deleted,
so the scheduler never sees a pool with fewer devices than it has.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from gpuplane.driver.inventory import Inventory
from gpuplane.driver.publish import slices

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


def _spec_without_pool(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec = dict(obj.get("spec", {}))
    spec.pop("pool", None)
    return spec


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal slice specs regardless of the taints' ``timeAdded`` (defaulted by the API server)."""
    return json.dumps(_without_time_added(a), sort_keys=True) == json.dumps(_without_time_added(b), sort_keys=True)


def _unordered(spec: Mapping[str, Any]) -> str:
    """A slice spec with its devices sorted by name and without taint times: equal for two specs that differ
    only in device order."""
    out = _without_time_added(spec)
    out["devices"] = sorted(out.get("devices") or [], key=lambda d: str(d.get("name", "")))
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
        in_place: bool = True,
        counter_sets_per_slice: int = slices.MAX_COUNTER_SETS,
    ) -> None:
        """``layout`` builds the pool (default: ``slices.build_pool``; the driver passes the steered layout
        when steering is on) and ``on_write`` is told the verb of every write (the driver's metric).

        ``in_place=False`` and ``counter_sets_per_slice=1`` (the default layout's) are the behaviour and
        layout before the fleet-scale fixes (every change rewrites the pool; one counter slice per GPU),
        kept so that ``bench.fleet.fleet_scale`` measures before and after side by side; the driver never sets
        them."""
        if not 1 <= counter_sets_per_slice <= slices.MAX_COUNTER_SETS:
            raise ValueError(
                f"counter_sets_per_slice must be 1..{slices.MAX_COUNTER_SETS}, not {counter_sets_per_slice}"
            )
        self.api = api
        self.node_name = node_name
        self.driver_name = driver_name
        self.taints = taints or (lambda: {})
        self.in_place = in_place
        self.counter_sets_per_slice = counter_sets_per_slice
        self.layout: Layout = layout or (
            lambda inv, t: slices.build_pool(inv, driver_name, t, counter_sets_per_slice=self.counter_sets_per_slice)
        )
        self.on_write = on_write or (lambda verb: None)
        self._lock = threading.Lock()
        self._published: str | None = None
        self._generation = 0
        self.devices_published = 0
        self.writes = {"create": 0, "replace": 0, "update": 0, "reorder": 0, "delete": 0}

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
            existing = {o["metadata"]["name"]: o for o in self.api.list_slices(self.node_name, self.driver_name)}
            current_gen = max((int(o["spec"]["pool"].get("generation", 0)) for o in existing.values()), default=0)
            self._generation = max(self._generation, current_gen)
            in_place = self._in_place(existing, content)
            if in_place is not None:
                for obj, verb in in_place:
                    self._replace(obj, existing[obj["metadata"]["name"]], verb)
                self._published = desired
                self._count(content)
                if in_place:
                    updated = any(verb == "update" for _, verb in in_place)
                    (log.info if updated else log.debug)(
                        "updated ResourceSlices in place",
                        node=self.node_name,
                        slices=len(in_place),
                        updated=sum(1 for _, verb in in_place if verb == "update"),
                        generation=self._generation,
                    )
                return bool(in_place)
            self._generation += 1
            objs = slices.render_slices(content, self._generation, self.driver_name)
            slices.validate_pool(objs)
            for obj in objs:
                name = obj["metadata"]["name"]
                if name in existing:
                    self._replace(obj, existing[name], "replace")
                else:
                    self.api.create_slice(obj)
                    self._wrote("create")
            wanted = {o["metadata"]["name"] for o in objs}
            for name in existing:
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

    def _replace(self, obj: Mapping[str, Any], have: Mapping[str, Any], verb: str) -> None:
        body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": have["metadata"]["resourceVersion"]}}
        self.api.replace_slice(obj["metadata"]["name"], body)
        self._wrote(verb)

    def _in_place(
        self, existing: Mapping[str, Mapping[str, Any]], content: slices.PoolContent
    ) -> list[tuple[dict[str, Any], str]] | None:
        """The slices to update at the pool's generation (with the verb each write counts as), or None
        when the change needs a new generation. Empty: the API already holds the pool.

        In place when the existing pool is complete at one generation with the slices' names the
        content wants, at most one slice's devices change ("update") and every other changed slice
        differs only in device order ("reorder"); never with ``in_place=False``. Taints' ``timeAdded``
        is taken from the API's copy where the driver leaves it out (the API server fills it in), so it
        is neither a change nor restamped by a rewrite.
        """
        if not existing or len(existing) != len(content.slice_specs):
            return None
        gens = {int(o["spec"]["pool"].get("generation", 0)) for o in existing.values()}
        if len(gens) != 1 or any(
            o["spec"]["pool"].get("resourceSliceCount") != len(existing) for o in existing.values()
        ):
            return None
        generation = gens.pop()
        objs = slices.render_slices(content, generation, self.driver_name)
        writes: list[tuple[dict[str, Any], str]] = []
        for obj in objs:
            have = existing.get(obj["metadata"]["name"])
            if have is None:
                return None
            got = _spec_without_pool(have)
            want = _keep_taint_times(_spec_without_pool(obj), got)
            if _same(want, got):
                continue
            verb = "reorder" if _unordered(want) == _unordered(got) else "update"
            writes.append(({**obj, "spec": {**want, "pool": obj["spec"]["pool"]}}, verb))
        if writes and not self.in_place:
            return None
        if sum(1 for _, verb in writes if verb == "update") > 1:
            return None
        slices.validate_pool(objs)
        return writes

    def _count(self, content: slices.PoolContent) -> None:
        self.devices_published = sum(len(s.get("devices") or []) for s in content.slice_specs)

    def unpublish(self) -> None:
        with self._lock:
            for obj in self.api.list_slices(self.node_name, self.driver_name):
                self.api.delete_slice(obj["metadata"]["name"])
            self._published = None
