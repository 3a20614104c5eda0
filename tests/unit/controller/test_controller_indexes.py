"""The controller's compact indexes: slices as digests, claims and nodes as the fields it reads.

Every check compares against what the controller derives from the full API objects, so a digest
that dropped something placement, labels or gang bookkeeping reads would fail here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuplane.api import names as dn
from gpuplane.controller import indexed, names
from gpuplane.controller.node import labels as nodelabels
from gpuplane.controller.node import slice_index, snapshot_builder
from gpuplane.driver.publish.slices import DeviceTaint
from tests.controllerkit import CLUSTER, node_slices

TAINTS = {"gpu-1": [DeviceTaint(key="gpu.gpuplane.dev/xid", value="xid-94", effect="NoSchedule")]}


def pool(tmp: Path, node: str, profile: str, clique: int | None = None) -> list[dict[str, Any]]:
    return node_slices(tmp, node, profile, clique, taints=TAINTS, generation=3)


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sim")
    return [
        *pool(tmp, "hgx-0", "hgx-h100"),
        *pool(tmp, "hgx-1", "hgx-h100"),
        *pool(tmp, "nvl-0", "gb200-nvl72", clique=1),
    ]


class TestSliceDigest:
    def test_keeps_every_gpu_and_mig_device_and_shares_mig_devices_between_nodes(
        self, raw: list[dict[str, Any]]
    ) -> None:
        interner = slice_index.Interner()
        digests = [slice_index.digest(s["metadata"]["name"], s["spec"], interner) for s in raw]
        assert all(d is not None for d in digests)
        got = [d for d in digests if d is not None]
        assert sum(len(d.gpus) for d in got) == 8 + 8 + 4
        assert sum(len(d.mig) for d in got) == 200 + 200 + 100
        a = next(d for d in got if d.node == "hgx-0" and "gpu-3-mig-3g-40gb-4" in d.mig)
        b = next(d for d in got if d.node == "hgx-1" and "gpu-3-mig-3g-40gb-4" in d.mig)
        assert a.mig["gpu-3-mig-3g-40gb-4"] is b.mig["gpu-3-mig-3g-40gb-4"]
        assert len(interner) == 200 + 100  # one object per distinct (GPU minor, profile, placement)
        dev = a.mig["gpu-3-mig-3g-40gb-4"]
        assert (dev.parent_minor, dev.driver_profile, dev.first_slice, dev.memory_slices, dev.compute) == (
            3,
            "3g.40gb",
            4,
            4,
            3,
        )

    def test_another_drivers_slice_is_not_kept(self, raw: list[dict[str, Any]]) -> None:
        spec = {**raw[0]["spec"], "driver": "other.example.com"}
        assert slice_index.digest("x", spec) is None

    def test_view_from_digests_equals_view_from_api_objects(self, raw: list[dict[str, Any]]) -> None:
        interner = slice_index.Interner()
        digests = [d for s in raw if (d := slice_index.digest(s["metadata"]["name"], s["spec"], interner))]
        from_raw = snapshot_builder.build_view(raw)
        from_digests = snapshot_builder.build_view(digests)
        assert from_raw.gpus == from_digests.gpus
        assert dict(from_raw.profiles) == dict(from_digests.profiles)
        assert dict(from_raw.mig) == dict(from_digests.mig)
        info = from_digests.mig["hgx-1/gpu-3-mig-3g-40gb-4"]
        assert (info.parent, info.profile, info.start, info.driver_profile) == ("hgx-1/gpu-3", "3g", 4, "3g.40gb")
        assert len(from_digests.mig) == 500
        with pytest.raises(KeyError):
            from_digests.mig["hgx-1/gpu-9-mig-3g-40gb-4"]
        gpu = from_digests.by_id["nvl-0/gpu-2"]
        assert gpu.attributes[f"{dn.DRIVER_NAME}/{dn.ATTR_PRODUCT_NAME}"] == "NVIDIA GB200"
        assert gpu.domain == f"{CLUSTER}.1"

    def test_allocated_mig_claim_is_placed_from_digests(self, raw: list[dict[str, Any]]) -> None:
        digests = [d for s in raw if (d := slice_index.digest(s["metadata"]["name"], s["spec"]))]
        claim = {
            "metadata": {"name": "c", "namespace": "ns"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"driver": dn.DRIVER_NAME, "pool": "hgx-0", "device": "gpu-2-mig-1g-10gb-5"}]
                    }
                }
            },
        }
        view = snapshot_builder.build_view(digests, [indexed.claim(claim)])
        assert [(i.profile, i.start) for i in view.taken_mig["hgx-0/gpu-2"]] == [("1g", 5)]

    def test_node_label_from_the_nodes_own_digests(self, raw: list[dict[str, Any]]) -> None:
        digests = [d for s in raw if (d := slice_index.digest(s["metadata"]["name"], s["spec"]))]
        own = [d for d in digests if d.node == "nvl-0"]
        assert nodelabels.domains_of_node("nvl-0", own) == nodelabels.domains_of_node("nvl-0", raw) == {f"{CLUSTER}.1"}
        assert nodelabels.domains_of_node("hgx-0", digests) == {"hgx-0.nvl0"}


class TestIndexedObjects:
    def test_claim_keeps_what_gangs_and_placement_read(self) -> None:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": "tp8-0",
                "namespace": "ns",
                "uid": "u",
                "labels": {names.LABEL_MEMBER_INDEX: "0", "team": "a"},
                "annotations": {names.ANNOTATION_DECISION: "d1", "other": "x" * 1000},
                "ownerReferences": [
                    {"apiVersion": names.GANG_API_VERSION, "kind": names.GANG_KIND, "name": "tp8", "uid": "g"},
                    {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "p"},
                ],
                "managedFields": [{"manager": "kube-scheduler", "fieldsV1": {"f:status": {}}}],
                "deletionTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"devices": {"requests": [{"name": "gpus"}]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"driver": dn.DRIVER_NAME, "pool": "n", "device": "gpu-0", "request": "gpus"},
                            {"driver": "other.example.com", "pool": "n", "device": "nic-0", "request": "nic"},
                        ]
                    },
                    "nodeSelector": {"nodeSelectorTerms": []},
                },
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "p"}],
            },
        }
        got = indexed.claim(body)
        assert got == indexed.ClaimView(
            name="tp8-0",
            namespace="ns",
            uid="u",
            annotations={names.ANNOTATION_DECISION: "d1"},
            labels={names.LABEL_MEMBER_INDEX: "0"},
            owners=(
                indexed.OwnerRef(kind=names.GANG_KIND, name="tp8", uid="g", api_version=names.GANG_API_VERSION),
                indexed.OwnerRef(kind="Pod", name="p", uid="p", api_version="v1"),
            ),
            deleting=True,
            requests=({"name": "gpus"},),
            allocated=True,
            results=(indexed.DeviceResult(request="gpus", pool="n", device="gpu-0"),),  # not the other driver's
            reserved_for=(indexed.Consumer(resource="pods", name="p", uid="p"),),
        )
        assert (got.key, got.gang, got.member_index, got.decision) == ("ns/tp8-0", "ns/tp8", 0, "d1")
        assert got.spec() == {"devices": {"requests": [{"name": "gpus"}]}}
        with pytest.raises(TypeError):  # read-only: every reader shares the one view
            got.annotations["x"] = "y"  # type: ignore[index]

    def test_a_claim_of_any_shape_reads_as_absent_fields_not_an_error(self) -> None:
        hostile = {
            "metadata": {"name": "c", "namespace": "ns", "labels": ["x"], "ownerReferences": {"kind": "Pod"}},
            "spec": {"devices": "all of them"},
            "status": {"allocation": {"devices": {"results": ["x", {"driver": dn.DRIVER_NAME, "pool": 7}]}}},
        }
        got = indexed.claim(hostile)
        assert (got.labels, got.owners, got.requests) == ({}, (), ())
        assert got.results == (indexed.DeviceResult(request="", pool="", device=""),)  # a pool of 7 names none
        assert got.gang is None and got.member_index == 0
        not_a_number = indexed.claim({"metadata": {"labels": {names.LABEL_MEMBER_INDEX: "two"}}})
        assert not_a_number.member_index == 0

    def test_allocated_elsewhere_still_counts_as_allocated(self) -> None:
        body = {
            "metadata": {"name": "c", "namespace": "ns"},
            "status": {"allocation": {"devices": {"results": [{"driver": "other.example.com", "device": "x"}]}}},
        }
        got = indexed.claim(body)
        assert got.allocated and got.results == ()  # gang reservations treat it as allocated; nothing of ours

    def test_node_keeps_readiness_uid_and_its_labels(self) -> None:
        body = {
            "metadata": {
                "name": "n1",
                "uid": "u1",
                "labels": {names.NODE_LABEL_NVLINK_DOMAIN: "d", "kubernetes.io/hostname": "n1"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                "managedFields": [{"manager": "kwok"}],
            },
            "spec": {"unschedulable": False},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "capacity": {"cpu": "224"}},
        }
        got = indexed.node(body)
        assert got == indexed.NodeView(
            name="n1",
            uid="u1",
            schedulable=True,
            labels={names.NODE_LABEL_NVLINK_DOMAIN: "d", "kubernetes.io/hostname": "n1"},
        )
        with pytest.raises(TypeError):  # read-only: every reader shares the one view
            got.labels["x"] = "y"  # type: ignore[index]
        cordoned = {**body, "spec": {"unschedulable": True}}
        assert indexed.node(cordoned).schedulable is False
        assert indexed.node({"metadata": {"name": "n2"}}).schedulable is False  # no Ready condition
        want = nodelabels.desired({"d"})
        assert nodelabels.patch_for(got.labels, got.nvlink_domains, want) is None
        both = {**body, "metadata": {**body["metadata"], "annotations": {names.ANNOTATION_NVLINK_DOMAINS: "a,b"}}}
        assert indexed.node(both).nvlink_domains == "a,b"


def test_claim_index_keeps_what_template_gangs_read() -> None:
    """A template member's claim: its Pod owners (the controlling one marked) and its requests, nothing else."""
    body: dict[str, Any] = {
        "metadata": {
            "name": "w-0-gpus-abc",
            "namespace": "ns",
            "managedFields": [{"manager": "kube-controller-manager"}],
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "w-0", "uid": "u-1", "controller": True},
                {"apiVersion": "v1", "kind": "Pod", "name": "other", "uid": "u-2"},
            ],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": "gpu.gpuplane.dev",
                            "count": 4,
                            "allocationMode": "ExactCount",
                            "selectors": [{"cel": {"expression": "true"}}],
                        },
                    }
                ],
                "constraints": [{"matchAttribute": "gpu.gpuplane.dev/nvlinkDomain"}],
            }
        },
    }
    got = indexed.claim(body)
    assert got.pod_owners == (
        indexed.OwnerRef(kind="Pod", name="w-0", uid="u-1", api_version="v1", controller=True),
        indexed.OwnerRef(kind="Pod", name="other", uid="u-2", api_version="v1"),
    )
    # The requests as written (steering reads their selectors); not the constraints, which nothing reads.
    assert got.spec() == {"devices": {"requests": body["spec"]["devices"]["requests"]}}
    assert got.requests[0] is not body["spec"]["devices"]["requests"][0]  # a copy
    assert not got.allocated and got.gang is None


def test_equal_requests_are_kept_once_and_names_interned_without_changing_a_claim() -> None:
    def body(i: int, share: bool) -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": "gpu.gpuplane.dev", "count": 1}
        if share:
            exactly["capacity"] = {"requests": {"sharePercent": "25"}}
        result = {"driver": dn.DRIVER_NAME, "request": "gpus", "pool": "node-1", "device": "gpu-3"}
        return {
            "metadata": {"name": f"c{i}", "namespace": "team-a", "uid": f"u{i}"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
            "status": {"allocation": {"devices": {"results": [dict(result)]}}},
        }

    # Built from fresh strings, as the JSON decoder gives them (not literals the compiler shares).
    a, b, c = (indexed.claim(json.loads(json.dumps(body(i, s)))) for i, s in ((1, True), (2, True), (3, False)))
    assert a.requests is b.requests  # one template: one copy
    assert c.requests is not a.requests
    assert a.spec() == body(1, True)["spec"] and c.spec() == body(3, False)["spec"]  # the same values
    ra, rb = a.results[0], b.results[0]
    assert all(getattr(ra, k) is getattr(rb, k) for k in ("request", "pool", "device", "share_percent"))
    assert ra.share_percent is None and a.namespace is b.namespace


def test_shared_shapes_are_bounded() -> None:
    shapes = indexed.Shapes(size=3)
    first = shapes([{"n": 0}])
    for i in range(1, 10):
        shapes([{"n": i}])
    assert len(shapes) == 3
    assert shapes([{"n": 0}]) is not first  # forgotten: kept again, not shared with the old one
    assert shapes([{"n": 9}]) == [{"n": 9}]
    unencodable = [{"x": object()}]
    assert shapes(unencodable) is unencodable


def test_a_claim_reserved_for_its_owner_pod_keeps_one_copy_of_the_pods_name_and_uid() -> None:
    pod = {"name": "w-0", "uid": "u-1"}
    body = json.loads(
        json.dumps(
            {
                "metadata": {"name": "c", "namespace": "ns", "ownerReferences": [{"kind": "Pod", **pod}]},
                "status": {"reservedFor": [{"resource": "pods", **pod}, {"resource": "pods", "name": "x", "uid": "y"}]},
            }
        )
    )
    got = indexed.claim(body)
    owner, (mine, other) = got.owners[0], got.reserved_for
    assert (mine.name, mine.uid, other.name, other.uid) == ("w-0", "u-1", "x", "y")
    assert mine.name is owner.name and mine.uid is owner.uid  # shared, not equal copies
