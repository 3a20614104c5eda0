"""Keep this node's ResourceSlices equal to the desired pool.

Only slices with ``spec.nodeName == <node>`` and ``spec.driver == <driver>`` are
ever read, written or deleted. The pool generation rises whenever the content
changes; new-generation slices are written before stale ones are deleted, so the
scheduler never sees a pool with fewer devices than it has.
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


def _spec_without_pool(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec = dict(obj.get("spec", {}))
    spec.pop("pool", None)
    return spec


class SlicePublisher:
    """Publishes the pool; call :meth:`publish` with every new inventory (cheap when unchanged)."""

    def __init__(
        self,
        api: SliceApi,
        node_name: str,
        driver_name: str,
        taints: Callable[[], Mapping[str, Sequence[slices.DeviceTaint]]] | None = None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.driver_name = driver_name
        self.taints = taints or (lambda: {})
        self._lock = threading.Lock()
        self._published: str | None = None
        self._generation = 0
        self.devices_published = 0

    def publish(self, inventory: Inventory, force: bool = False) -> bool:
        """Bring the API in line with the inventory. Returns True when something was written."""
        content = slices.build_pool(inventory, self.driver_name, self.taints())
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
                and _fingerprint([_spec_without_pool(o) for o in existing]) == desired
                and all(o["spec"]["pool"].get("resourceSliceCount") == len(existing) for o in existing)
                and len({o["spec"]["pool"].get("generation") for o in existing}) == 1
            ):
                self._published = desired
                self._count(content)
                return False
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
                else:
                    self.api.create_slice(obj)
            wanted = {o["metadata"]["name"] for o in objs}
            for name in by_name:
                if name not in wanted:
                    self.api.delete_slice(name)
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

    def _count(self, content: slices.PoolContent) -> None:
        self.devices_published = sum(len(s.get("devices") or []) for s in content.slice_specs)

    def unpublish(self) -> None:
        with self._lock:
            for obj in self.api.list_slices(self.node_name, self.driver_name):
                self.api.delete_slice(obj["metadata"]["name"])
            self._published = None
