"""Hostile ResourceSlices and quarantined stubs through the controller's indexes: nothing raises.

A slice is written by a node (or by anyone holding a node's credentials), so every field is
hostile. The slice index digests each slice once per watch event; a digest that raised would
fail that indexer on every event of the object. These tests hand :func:`slice_index.digest` and
the controller's own indexers (:mod:`gpuplane.controller.caches`) objects of every wrong shape and
check the answer: None (not ours, or beyond what the API allows) or a digest holding only the
well-formed devices; a quarantined stub (:mod:`gpuplane.api.boundedjson`) is left out of
every index; another driver's slice is left out of the slice index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuplane.api import boundedjson
from gpuplane.api import names as dn
from gpuplane.controller import caches, metrics
from gpuplane.controller.node import slice_index, snapshot_builder
from tests import indexkit

D = dn.DRIVER_NAME


def gpu(name: str, **attrs: Any) -> dict[str, Any]:
    """A well-formed whole-GPU device as the driver publishes one."""
    return {
        "name": name,
        "attributes": {dn.ATTR_TYPE: {"string": dn.DEVICE_TYPE_GPU}, **attrs},
        "capacity": {dn.CAP_MEMORY: {"value": "80Gi"}},
    }


def spec(*devices: Any, **extra: Any) -> dict[str, Any]:
    return {"driver": D, "pool": {"name": "n1", "generation": 1}, "nodeName": "n1", "devices": list(devices), **extra}


GOOD = gpu("gpu-0", **{dn.ATTR_PRODUCT_NAME: {"string": "NVIDIA H100"}})
MIG_TYPE = {dn.ATTR_TYPE: {"string": dn.DEVICE_TYPE_MIG}, dn.ATTR_MIG_PROFILE: {"string": "1g.10gb"}}

HOSTILE_DEVICES: list[Any] = [
    None,
    7,
    "gpu-1",
    ["gpu-1"],
    {},  # no name
    {"name": None, "attributes": {dn.ATTR_TYPE: {"string": dn.DEVICE_TYPE_GPU}}},
    {"name": 12, "attributes": {dn.ATTR_TYPE: {"string": dn.DEVICE_TYPE_GPU}}},
    {"name": "x" * 10_000, "attributes": {dn.ATTR_TYPE: {"string": dn.DEVICE_TYPE_GPU}}},
    {"name": "a1", "attributes": ["type", "gpu"]},
    {"name": "a2", "attributes": "gpu"},
    {"name": "a3", "attributes": {dn.ATTR_TYPE: "gpu"}},
    {"name": "a4", "attributes": {dn.ATTR_TYPE: {"string": ["gpu"]}}},
    {"name": "a5", "attributes": {dn.ATTR_TYPE: {"string": {"gpu": 1}}}},
    {"name": "a6", "attributes": {dn.ATTR_TYPE: None, 7: {"int": 1}}},
    {"name": "m1", "attributes": MIG_TYPE, "consumesCounters": {"counters": {}}},
    {"name": "m2", "attributes": MIG_TYPE, "consumesCounters": [5]},
    {"name": "m3", "attributes": MIG_TYPE, "consumesCounters": [{"counters": ["memory-slice-0"]}]},
    {
        "name": "m4",
        "attributes": MIG_TYPE,
        "consumesCounters": [
            {
                "counters": {
                    "memory-slice-x": {"value": "1"},
                    "memory-slice-\u00b2": {"value": "1"},  # a digit to str.isdigit, not to int()
                    "memory-slice-99999999999999999999": {"value": "1"},
                    7: {"value": "1"},
                    "compute-slices": {"value": True},
                }
            }
        ],
    },
    {
        "name": "m5",
        "attributes": {**MIG_TYPE, dn.ATTR_PARENT_MINOR: {"int": "3"}, dn.ATTR_PRODUCT_NAME: {"string": 5}},
        "consumesCounters": [{"counters": {"memory-slice-0": {"value": "1"}, "compute-slices": {"value": 10**400}}}],
        "capacity": {dn.CAP_MEMORY: {"value": ["10Gi"]}, dn.CAP_MULTIPROCESSORS: "16"},
    },
    {"name": "t1", "attributes": {dn.ATTR_TYPE: {"string": "switch"}}, "taints": {"key": "x"}},
    {"name": "t2", "taints": "gpu.gpuplane.dev/noisy-neighbour"},
    {"name": "t3", "taints": [None, 3, {"key": ["k"]}]},
]


class TestDigestIsTotal:
    @pytest.mark.parametrize("bad", [None, [], "spec", 5, {"devices": [GOOD]}, {"driver": ["x"]}])
    def test_a_spec_that_is_not_ours_or_not_a_mapping_is_none(self, bad: Any) -> None:
        assert slice_index.digest("s", bad) is None

    @pytest.mark.parametrize("obj", [{}, {"metadata": {"name": "s"}}, {"metadata": [1], "spec": "x"}, None, 3])
    def test_a_slice_without_a_spec_is_none(self, obj: Any) -> None:
        assert slice_index.as_digest(obj) is None

    @pytest.mark.parametrize("devices", [None, {"gpu-0": GOOD}, "gpu-0", 128, [[GOOD]]])
    def test_devices_that_are_not_a_list_of_objects_read_as_none(self, devices: Any) -> None:
        got = slice_index.digest("s", {**spec(), "devices": devices})
        assert got is not None and got.gpus == () and dict(got.mig) == {}

    @pytest.mark.parametrize("bad", HOSTILE_DEVICES, ids=range(len(HOSTILE_DEVICES)))
    def test_a_malformed_device_is_skipped_and_its_neighbour_kept(self, bad: Any) -> None:
        got = slice_index.digest("s", spec(bad, GOOD))
        assert got is not None
        assert [g.id for g in got.gpus] == ["n1/gpu-0"]
        assert got.gpus[0].product == "NVIDIA H100" and got.gpus[0].memory_bytes == 80 * 2**30
        assert dict(got.mig) == {} and got.noisy == ()

    def test_every_hostile_device_in_one_slice_and_a_view_built_from_it(self) -> None:
        got = slice_index.digest("s", spec(*HOSTILE_DEVICES, GOOD))
        assert got is not None and [g.device for g in got.gpus] == ["gpu-0"]
        view = snapshot_builder.build_view([got])
        assert [g.id for g in view.gpus] == ["n1/gpu-0"] and dict(view.mig) == {}
        assert view.snapshot(mig_profile="1g.10gb").domains == ()

    @pytest.mark.parametrize(
        "value", [{"int": 3}, {"string": 4}, {"string": ""}, {"bool": True}, ["nvl"], "nvl", {"string": "x" * 5000}]
    )
    def test_attributes_of_the_wrong_type_read_as_absent_or_as_written(self, value: Any) -> None:
        got = slice_index.digest("s", spec(gpu("gpu-0", **{dn.ATTR_NVLINK_DOMAIN: value, dn.ATTR_PRODUCT_NAME: value})))
        assert got is not None and len(got.gpus) == 1
        g = got.gpus[0]
        assert isinstance(g.domain, str) and isinstance(g.product, str)
        if not (isinstance(value, dict) and isinstance(value.get("string"), str) and value["string"]):
            assert g.domain == "n1.gpu-0"  # not a string: the GPU is its own domain, as when absent

    @pytest.mark.parametrize("generation", [None, "7", True, 1.5, 10**30])
    def test_a_malformed_generation_reads_as_generation_0(self, generation: Any) -> None:
        got = slice_index.digest("s", {**spec(GOOD), "pool": {"name": "n1", "generation": generation}})
        assert got is not None and got.generation == 0 and got.pool == "n1"

    @pytest.mark.parametrize("pool", [None, "n1", {"name": 5, "generation": "7"}, {"generation": 1}, {"name": ["n1"]}])
    def test_a_malformed_pool_name_is_not_read(self, pool: Any) -> None:
        # the driver names its pool after its node; anything else is not its slice (slice_index.untrusted)
        assert slice_index.digest("s", {**spec(GOOD), "pool": pool}) is None
        assert slice_index.untrusted({**spec(GOOD), "pool": pool}) == slice_index.POOL_NOT_NODE

    @pytest.mark.parametrize("node", [None, 5, ["n1"], "n" * 10_000, ""])
    def test_a_malformed_node_name_is_not_read(self, node: Any) -> None:
        assert slice_index.digest("s", {**spec(GOOD), "nodeName": node}) is None
        assert slice_index.untrusted({**spec(GOOD), "nodeName": node}) == slice_index.NO_NODE

    def test_10000_devices_are_more_than_the_api_allows_and_the_slice_is_not_read(self) -> None:
        assert slice_index.digest("s", spec(*(gpu(f"gpu-{i}") for i in range(10_000)))) is None
        at_limit = slice_index.digest("s", spec(*(gpu(f"gpu-{i}") for i in range(slice_index.MAX_DEVICES))))
        assert at_limit is not None and len(at_limit.gpus) == slice_index.MAX_DEVICES


@pytest.fixture(scope="module")
def index_fns() -> dict[str, Any]:
    """Every indexer of the controller's informer streams, by index name."""
    return {name: fn for s in caches.streams(metrics.ControllerMetrics()) for name, fn in s.indexers.items()}


def call(fn: Any, body: Any) -> Any:
    """The indexer's answer, None for "not indexed" (an empty mapping)."""
    got = fn(body)
    assert got is not None
    return got or None


class TestIndexHandlers:
    @pytest.mark.parametrize("idx", ["claim_idx", "slice_idx", "node_idx", "class_idx", "gang_idx", "member_pod_idx"])
    def test_a_quarantined_stub_is_in_no_index(self, index_fns: dict[str, Any], idx: str) -> None:
        deep = "[" * 3000 + "]" * 3000  # as the API server would serve it: JSON text 3,000 levels deep
        meta = '"metadata": {"name": "o", "namespace": "ns"}'
        text = f'{{{meta}, "spec": {{"driver": "{D}", "nodeName": "n1", "x": {deep}}}}}'
        stub = boundedjson.decode_object(text)  # what the informer's client hands on (gpuplane.informer.client)
        assert boundedjson.rejection(stub) is not None
        assert call(index_fns[idx], stub) is None

    def test_another_drivers_slice_is_not_indexed(self, index_fns: dict[str, Any]) -> None:
        body = {"metadata": {"name": "s"}, "spec": {**spec(GOOD), "driver": "gpu.example.com"}}
        assert call(index_fns["slice_idx"], body) is None

    def test_a_hostile_slice_of_ours_is_indexed_by_its_node_with_only_its_good_devices(
        self, index_fns: dict[str, Any]
    ) -> None:
        body = {"metadata": {"name": "s"}, "spec": spec(*HOSTILE_DEVICES, GOOD)}
        got = call(index_fns["slice_idx"], body)
        assert list(got) == ["n1"] and [g.id for g in got["n1"].gpus] == ["n1/gpu-0"]
        assert call(index_fns["slice_idx"], {"metadata": {"name": "s"}, "spec": "x"}) is None

    def test_the_drivers_own_slices_are_indexed_whole(self, index_fns: dict[str, Any], tmp_path: Path) -> None:
        raw = indexkit.fleet(tmp_path)
        digests = [call(index_fns["slice_idx"], s) for s in raw]
        assert all(d is not None for d in digests)
        assert sum(len(d[k].gpus) for d in digests for k in d) == 8 + 8 + 4
