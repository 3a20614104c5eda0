"""The member-pod index's view of a gang's pod: what membership reads, nothing a tenant can inflate, any shape."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.controller import caches, indexed, names
from gpuplane.controller.gang import membership, podview
from tests.controllerkit import member_pod, pod_body
from tests.templatekit import job_pod

LWS_POD: dict[str, Any] = {
    "metadata": {
        "name": "w-1",
        "namespace": "team-a",
        "uid": "u-1",
        "labels": {
            names.LABEL_GANG: "g",
            podview.LWS_WORKER_INDEX: "1",
            podview.LWS_GROUP_INDEX: "0",
            podview.LWS_NAME: "w",
            "app": "x" * 60,
        },
        "annotations": {podview.LWS_SIZE: "2", "notes": "y" * 200_000},
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "w-0", "uid": "s", "controller": True}
        ],
        "managedFields": [{"manager": "kube-controller-manager"}],
    },
    "spec": {
        "containers": [{"name": "main", "image": "x", "env": [{"name": "E", "value": "z" * 100_000}]}],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}],
        "schedulingGates": [{"name": names.SCHEDULING_GATE}],
        "priority": 1000,
        "preemptionPolicy": "Never",
        "affinity": {"nodeAffinity": {}},
    },
    "status": {
        "phase": "Pending",
        "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "w-1-gpus-abc"}],
        "extendedResourceClaimStatus": {"resourceClaimName": "w-1-extended"},
    },
}


def test_a_member_pod_keeps_what_membership_reads_and_no_more() -> None:
    got = podview.view(LWS_POD)
    assert (got.name, got.namespace, got.uid, got.gang, got.gang_key) == ("w-1", "team-a", "u-1", "g", "team-a/g")
    assert "app" not in got.labels and got.annotations == {podview.LWS_SIZE: "2"}  # not the tenant's 200 kB
    assert got.claims == (indexed.PodClaimRef("gpus", template="t"),)
    assert got.given == ("w-1-gpus-abc", "w-1-extended")
    assert (got.gates, got.node, got.phase, got.controller) == (
        (names.SCHEDULING_GATE,),
        "",
        "Pending",
        ("StatefulSet", "w-0"),
    )
    assert (got.priority, got.never_preempts, got.affinity) == (1000, True, {"nodeAffinity": {}})
    assert caches.member_pod(LWS_POD) == {"team-a/w-1": got}
    (member,) = membership.members_of("g", 2, [got]).by_index.values()
    assert (member.index, member.templated, member.claims, member.controlled) == (1, True, got.given, True)
    with pytest.raises(TypeError):  # read-only: every reader shares the one view
        got.labels["x"] = "y"  # type: ignore[index]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"metadata": ["p"], "spec": "s", "status": 3},
        {
            "metadata": {"name": "p", "labels": {names.LABEL_GANG: 7}, "ownerReferences": "x"},
            "spec": {"resourceClaims": ["a", {"name": 1}], "schedulingGates": {"name": "g"}, "priority": True},
            "status": {"resourceClaimStatuses": [{"resourceClaimName": None}], "phase": ["Running"]},
        },
    ],
)
def test_a_pod_of_any_shape_reads_as_absent_fields_not_an_error(body: dict[str, Any]) -> None:
    got = podview.view(body)
    assert (got.gang, got.given, got.gates, got.phase, got.priority, got.controller) == ("", (), (), "", 0, None)
    assert membership.members_of("", 1, [got]).by_index == {}  # no gang: never a member


@pytest.mark.parametrize(
    "pod",
    [member_pod("g", 0), job_pod("g", "p-0", labels={membership.COMPLETION_INDEX: "0"}, claims=("c",)), LWS_POD],
)
def test_the_fake_apis_body_reads_back_as_the_same_view(pod: dict[str, Any]) -> None:
    view = podview.view(pod)
    assert podview.view(pod_body(view)) == view
