"""Steering reads from the controller's compact indexes what it reads from the API objects.

The steering pass (``steer.run.steer_pass``) reads every node's labels from the node index (a gated
pod's nodeSelector and node affinity), builds its view from the slice index's digests, and reads
claims from the claim index (:class:`~gpuplane.controller.indexed.ClaimView`, the only form steering
takes): a named claim's requests (class, count, selectors, capacity) and, for the reservations of
steered pods, the Pod owners of allocated claims. Here one pass runs over the API's slices and node
labels and once over the indexed forms, both with the claims as the claim index holds them, on pools
the driver itself builds (tests/indexkit.py), and the actions, the reservations and the patches must
be equal and non-trivial; the claims' requests must be kept as written, and the allocated claim's Pod
owner read. Dropping a label, a request field or a Pod owner from ``gpuplane.controller.indexed``
makes it fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpuplane.api import names as dn
from gpuplane.controller import claimtemplate, indexed, steps
from gpuplane.controller.node import slice_index, snapshot_builder
from gpuplane.controller.steer import decide as steer_decide
from gpuplane.controller.steer import reconciler as steer_reconciler
from gpuplane.controller.steer import run as steer_run
from gpuplane.placement import model
from gpuplane.placement.policies import gpuplane
from tests import controllerkit
from tests.indexkit import fleet, slice_idx


@pytest.fixture(scope="module")
def raw_slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return fleet(tmp_path_factory.mktemp("sim"))


GATE = steer_decide.Settings().gate


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"kubernetes.io/hostname": name, **labels},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "capacity": {"cpu": "224"}},
    }


def _named(name: str, exactly: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", **meta},
        "spec": {
            "devices": {
                "requests": [{"name": "g", "exactly": exactly}],
                "constraints": [{"requests": ["g"], "matchAttribute": f"{dn.DRIVER_NAME}/{dn.ATTR_NVLINK_DOMAIN}"}],
            }
        },
        "status": {},
    }


def _gated(name: str, claim: str = "", template: str = "", **spec: Any) -> dict[str, Any]:
    ref = {"name": "g", "resourceClaimName": claim} if claim else {"name": "g", "resourceClaimTemplateName": template}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"resourceClaims": [ref], "schedulingGates": [{"name": GATE}], **spec},
    }


def _steering_inputs(raw: list[dict[str, Any]]) -> tuple[list[indexed.PodView], dict[str, dict[str, Any]]]:
    """Gated pods (and one steered pod whose claim is allocated) and the claims they name, as the API has them."""
    uuid = next(
        d["attributes"][dn.ATTR_UUID]["string"]
        for s in raw
        if s["spec"]["nodeName"] == "nvl-0"
        for d in s["spec"].get("devices") or []
        if d["name"] == "gpu-2"
    )
    pick = {
        "deviceClassName": "gpu.gpuplane.dev",
        "count": 1,
        "selectors": [{"cel": {"expression": f'device.attributes["{dn.DRIVER_NAME}"].uuid == "{uuid}"'}}],
    }
    share = {"deviceClassName": "gpu.gpuplane.dev", "capacity": {"requests": {dn.CAP_SHARE_PERCENT: "50"}}}
    held = _named("held", {"deviceClassName": "gpu.gpuplane.dev"})
    held["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "landed", "uid": "uid-landed"}]
    held["status"] = {
        "allocation": {"devices": {"results": [{"driver": dn.DRIVER_NAME, "pool": "hgx-0", "device": "gpu-0"}]}}
    }
    claims = {f"ns/{c['metadata']['name']}": c for c in (_named("pick", pick), _named("share", share), held)}
    placement = steer_decide.encode_placement(model.MemberPlacement(0, "hgx-0", "hgx-0.nvl0", ("hgx-0/gpu-0",), ()))
    landed = {
        "metadata": {
            "namespace": "ns",
            "name": "landed",
            "uid": "uid-landed",
            "annotations": {steer_reconciler.ANNOTATION_STEERED: placement},
        },
        "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "held"}]},
    }
    pods = [
        _gated("p-pick", claim="pick"),
        _gated("p-share", claim="share"),
        _gated("p-team", template="whole", nodeSelector={"pool.example/team": "a"}),
        _gated("p-3g", template="t3g"),
        landed,
    ]
    return [indexed.pending_pod(p) for p in pods], claims  # a pending pod is read only as indexed


class PodWriter:
    def __init__(self) -> None:
        self.steps: list[tuple[str, str, Any]] = []

    def run(self, namespace: str, step: steps.Step) -> None:
        self.steps.append((namespace, step.name, step.body))


MIG3 = {
    "deviceClassName": "mig.gpuplane.dev",
    "selectors": [{"cel": {"expression": f'device.attributes["{dn.DRIVER_NAME}"].migProfile == "3g.40gb"'}}],
}
TEMPLATES = {
    f"ns/{name}": claimtemplate.view(
        {
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": exactly}]}}},
        }
    )
    for name, exactly in (("whole", {"deviceClassName": "gpu.gpuplane.dev"}), ("t3g", MIG3))
}


def _steer(
    slices_: list[Any],
    claims: Mapping[str, indexed.ClaimView],
    labels: Mapping[str, Mapping[str, str]],
    pods: list[indexed.PodView],
) -> tuple[list[tuple[str, str, str, Any]], list[Any], list[tuple[str, str, Any]]]:
    """One steering pass as ``steer.run.steer_pass`` runs it: the view with the reservations, then decide."""
    reserved = steer_reconciler.reservations(pods, None, claims.values(), 1.0)
    view = snapshot_builder.build_view(slices_, claims.values(), None, reservations=reserved)
    state, writer = steer_reconciler.SteerState(), PodWriter()
    acts = steer_reconciler.run_pass(
        writer,
        gpuplane.GpuPlane(),
        None,
        state,
        steer_decide.Settings(),
        pending=pods,
        view=view,
        claims=claims,
        templates=TEMPLATES,
        classes=controllerkit.shipped_classes(),
        now=1.0,
        node_labels=labels,
    )
    state.drain()
    return [(a.kind, a.key, a.outcome, a.placement) for a in acts], reserved, sorted(writer.steps, key=str)


def test_steering_over_the_indexes_decides_what_it_decides_over_the_api_objects(
    raw_slices: list[dict[str, Any]],
) -> None:
    pods, raw_claims = _steering_inputs(raw_slices)
    nodes = [_node("hgx-0"), _node("hgx-1", **{"pool.example/team": "a"}), _node("nvl-0")]
    raw_labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    idx_labels = steer_run.node_labels({n["metadata"]["name"]: indexed.node(n) for n in nodes})  # as the handler
    idx_claims = {k: indexed.claim(c) for k, c in raw_claims.items()}  # as the claim index holds them
    for key, raw in raw_claims.items():  # every request field steering may read, as written
        assert idx_claims[key].spec() == {"devices": {"requests": raw["spec"]["devices"]["requests"]}}
    assert steer_reconciler.allocated_owners(idx_claims.values()) == {"uid-landed"}
    got_raw = _steer(raw_slices, idx_claims, raw_labels, pods)
    got_idx = _steer(slice_index.every(slice_idx(raw_slices)), idx_claims, idx_labels, pods)
    acts = {key: (kind, outcome, p) for kind, key, outcome, p in got_raw[0]}
    # Non-trivial over the API objects: the claim's selector (one GPU), its capacity request, the pod's
    # nodeSelector (a label only hgx-1 has), a MIG template, and no reservation for the landed pod.
    assert acts["ns/p-pick"][:2] == ("steer", "steered") and acts["ns/p-pick"][2].gpus == ("nvl-0/gpu-2",)
    assert acts["ns/p-share"][:2] == ("release", "unsteerable")
    assert acts["ns/p-team"][:2] == ("steer", "steered") and acts["ns/p-team"][2].node == "hgx-1"
    assert acts["ns/p-3g"][:2] == ("steer", "steered") and acts["ns/p-3g"][2].mig
    # The landed pod's annotation is not a reservation (only what a replica steered itself is: issue 32).
    assert got_raw[1] == [] and steer_reconciler.reservations(pods, None, [], 1.0) == []
    assert len(got_raw[2]) == 4  # one patch per gated pod
    assert got_idx == got_raw
