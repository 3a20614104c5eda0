"""The slice publisher puts back slices someone else deleted once it compares with the API (``force``).

kubelet deletes a node's ResourceSlices when it starts, while the driver keeps running with an
unchanged inventory; the driver's periodic tick publishes with ``force=True`` so they come back.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpuplane.api import names
from gpuplane.driver.publish import slices
from gpuplane.driver.publish.publisher import SlicePublisher
from testing.driverkit import driver_env


class MemorySlices:
    """The ResourceSlices of one node, in memory (a fake of the API server for this unit test)."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self._version = 0

    def list_slices(self, node_name: str, driver_name: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(s) for s in self.items.values()]

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._store(body)

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._store(body)

    def delete_slice(self, name: str) -> None:
        self.items.pop(name, None)

    def _store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._version += 1
        self.writes += 1
        obj = copy.deepcopy(dict(body))
        for device in obj["spec"].get("devices") or []:
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", f"2026-12-01T13:00:{self._version % 60:02d}Z")  # as the API server does
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(self._version)}
        self.items[obj["metadata"]["name"]] = obj
        return obj


def test_force_republishes_slices_deleted_behind_the_publishers_back() -> None:
    with driver_env("hgx-h100") as drv:
        api = MemorySlices()
        publisher = SlicePublisher(api, drv.node, names.DRIVER_NAME)
        inventory = drv.state.inventory()
        assert publisher.publish(inventory)
        count, writes = len(api.items), api.writes
        assert count > 0
        assert not publisher.publish(inventory, force=True), "nothing changed: no write"
        assert api.writes == writes
        api.items.clear()  # kubelet's start-up wipe
        assert not publisher.publish(inventory), "without force the publisher trusts its own memory"
        assert publisher.publish(inventory, force=True)
        assert len(api.items) == count
        generations = {s["spec"]["pool"]["generation"] for s in api.items.values()}
        assert len(generations) == 1 and generations.pop() >= 2, "the pool generation rose"


def test_a_tainted_device_does_not_make_every_forced_publish_a_write() -> None:
    # The API server fills in a taint's timeAdded; a comparison that counts it rewrote every slice (and moved
    # timeAdded) on every periodic tick for as long as a device was tainted.
    with driver_env("hgx-h100") as drv:
        api = MemorySlices()
        taint = slices.DeviceTaint(key="gpu.gpuplane.dev/xid", value="xid-48", effect="NoSchedule")
        publisher = SlicePublisher(api, drv.node, names.DRIVER_NAME, taints=lambda: {"gpu-0": [taint]})
        inventory = drv.state.inventory()
        assert publisher.publish(inventory)
        written = [t for s in api.items.values() for d in s["spec"].get("devices", []) for t in d.get("taints", [])]
        assert written and all("timeAdded" in t for t in written)
        writes = api.writes
        for _ in range(3):
            assert not publisher.publish(inventory, force=True), "the taint is unchanged: no write"
        assert api.writes == writes
