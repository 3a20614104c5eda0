"""One node's ResourceSlices in memory, behind the publisher's slice API (the tests' and benches' one copy).

:class:`SliceStore` keeps what a :class:`~gpuplane.driver.publish.publisher.SlicePublisher` writes,
stamps a new ``resourceVersion`` on every write, and refuses what the API server would refuse: a
create of a name that exists, a replace of a missing slice or one naming a stale ``resourceVersion``.
Every call is recorded in :attr:`SliceStore.calls` (``list``, ``create``, ``replace``, ``delete``).

With ``copies=False`` objects are stored and handed back without copies, for benches that write
hundreds of thousands of times (the publisher builds a new object for every write and never changes
what it read, so sharing is safe there).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


class SliceConflict(AssertionError):
    """What the API server answers with 409 or 404: a write the publisher should not have made."""


class SliceStore:
    """ResourceSlices of one node in a dict, with the API server's optimistic concurrency."""

    def __init__(self, *, copies: bool = True) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.rv = 0
        self.copies = copies

    def changed(self) -> None:
        """Called after every write; subclasses observe the pool here."""

    def writes(self) -> list[tuple[str, str]]:
        """The calls that changed something (no lists)."""
        return [c for c in self.calls if c[0] != "list"]

    def generations(self) -> set[int]:
        return {o["spec"]["pool"]["generation"] for o in self.objects.values()}

    def _out(self, obj: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(obj) if self.copies else obj

    def _store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = copy.deepcopy(dict(body)) if self.copies else dict(body)
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(self.rv)}
        self.objects[obj["metadata"]["name"]] = obj
        self.changed()
        return self._out(obj)

    def list_slices(self, node_name: str, driver_name: str) -> list[dict[str, Any]]:
        self.calls.append(("list", ""))
        return [self._out(o) for o in self.objects.values()]

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.objects:
            raise SliceConflict(f"409 AlreadyExists: create of existing slice {name}")
        self.calls.append(("create", name))
        return self._store(body)

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        current = self.objects.get(name)
        if current is None:
            raise SliceConflict(f"404 NotFound: replace of missing slice {name}")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise SliceConflict(f"409 Conflict: replace of {name} at a stale resourceVersion")
        self.calls.append(("replace", name))
        return self._store(body)

    def delete_slice(self, name: str) -> None:
        if name not in self.objects:
            raise SliceConflict(f"404 NotFound: delete of missing slice {name}")
        self.calls.append(("delete", name))
        self.rv += 1
        del self.objects[name]
        self.changed()
