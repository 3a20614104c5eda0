"""The MIG offer on a real control plane (issue 36, docs/mig-offer.md): the controller writes it, every
simulated node's driver publishes MIG placements by it, MIG requests beyond it grow it and run, and a
request that only a GPU outside the offer can serve is told why it waits, then runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.plane import components, identity, nodes, simnodes
from e2e.plane.access_review import access
from gpuplane.api import mig_offer
from tests.e2e.conftest import GpuCluster, eventually

pytestmark = pytest.mark.e2e
NS = "gpuplane-mig-offer-e2e"
D = "gpu.gpuplane.dev"
WAIT_LABEL = "e2e-mig-offer-wait"


def offer(gpu: GpuCluster) -> mig_offer.Offer | None:
    try:
        cm = gpu.kubectl_json("get", "configmap", "-n", mig_offer.NAMESPACE, mig_offer.CONFIGMAP)
    except Exception:  # not written yet
        return None
    return mig_offer.parse(cm["data"][mig_offer.DATA_KEY])


def mig_gpus(gpu: GpuCluster) -> dict[str, set[str]]:
    """Node -> the GPUs whose MIG placements its slices publish."""
    out: dict[str, set[str]] = {}
    for (pool, _), device in gpu.slice_devices().items():
        attrs = device["attributes"]
        if (attrs.get("type") or attrs.get(f"{D}/type") or {}).get("string") == "mig":
            minor = (attrs.get("parentMinor") or attrs.get(f"{D}/parentMinor") or {}).get("int")
            out.setdefault(pool, set()).add(f"gpu-{minor}")
    return out


def published_by_offer(gpu: GpuCluster) -> mig_offer.Offer | None:
    got = offer(gpu)
    if got is None:
        return None
    published = mig_gpus(gpu)
    nodes = {n.name for n in gpu.nodes}
    ok = all(published.get(n, set()) == set(got.for_node(n)) for n in nodes)
    return got if ok else None


def labelled(gpu: GpuCluster) -> set[str]:
    """The nodes that carry the MIG-offered label."""
    items = gpu.kubectl_json("get", "nodes", "-l", f"{mig_offer.NODE_LABEL}={mig_offer.NODE_LABEL_VALUE}")["items"]
    return {n["metadata"]["name"] for n in items}


def labelled_as_offered(gpu: GpuCluster) -> mig_offer.Offer | None:
    got = offer(gpu)
    ours = {n.name for n in gpu.nodes}
    return got if got is not None and labelled(gpu) & ours == {n for n in got.nodes if n in ours} else None


def test_the_drivers_publish_mig_placements_by_the_controllers_offer(gpu_cluster: GpuCluster) -> None:
    got = eventually(lambda: published_by_offer(gpu_cluster), 90, "every node publishing MIG by the offer")
    capable = sum(8 if n.profile == "hgx-h100" else 4 for n in gpu_cluster.nodes)
    assert 0 < got.gpu_count() < capable, got  # the spare set (2 per pool), not every GPU
    # Exactly the nodes the offer names carry the label (how many depends on what earlier tests left offered).
    got = eventually(lambda: labelled_as_offered(gpu_cluster), 30, "the MIG-offered label on the offer's nodes")
    assert labelled(gpu_cluster) & {n.name for n in gpu_cluster.nodes}, got


def test_only_the_controller_writes_the_offer_and_each_driver_reads_only_it(gpu_cluster: GpuCluster) -> None:
    driver = identity.username(identity.NAMESPACE, identity.DRIVER_SA)
    controller = identity.username(identity.NAMESPACE, identity.CONTROLLER_SA)
    cases = {
        (controller, "update", mig_offer.CONFIGMAP): True,
        (controller, "get", mig_offer.CONFIGMAP): True,
        (controller, "update", "someone-elses"): False,
        (controller, "delete", mig_offer.CONFIGMAP): False,
        (driver, "get", mig_offer.CONFIGMAP): True,
        (driver, "watch", mig_offer.CONFIGMAP): True,
        (driver, "update", mig_offer.CONFIGMAP): False,
        (driver, "patch", mig_offer.CONFIGMAP): False,
        (driver, "create", ""): False,
        (driver, "get", "someone-elses"): False,
    }
    api = gpu_cluster.cluster.api
    got = {k: access(api, k[0], (k[1], "", "configmaps", ""), mig_offer.NAMESPACE, k[2]) for k in cases}
    assert got == cases


def _manifest(tmp: Path, pods: int, node_selector: dict[str, str] | None = None) -> Path:
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]
    expr = f'device.attributes["{D}"].migProfile == "7g.80gb"'
    docs.append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "mig-7g", "namespace": NS},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "mig",
                                "exactly": {
                                    "deviceClassName": "mig.gpuplane.dev",
                                    "selectors": [{"cel": {"expression": expr}}],
                                },
                            }
                        ]
                    }
                }
            },
        }
    )
    for i in range(pods):
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"big-{i}", "namespace": NS},
                "spec": {
                    "nodeSelector": node_selector or {},
                    "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": "mig-7g"}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "mig"}]},
                        }
                    ],
                },
            }
        )
    path = tmp / "mig-offer.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return path


def test_mig_requests_beyond_the_offer_grow_it_and_run(gpu_cluster: GpuCluster, tmp_path: Path) -> None:
    before = eventually(lambda: published_by_offer(gpu_cluster), 90, "every node publishing MIG by the offer")
    h100_offered = sum(len(g) for n, g in before.nodes.items() if n.startswith("hgx"))
    pods = h100_offered + 2  # 7g.80gb takes a GPU: at least two need GPUs newly offered
    path = _manifest(tmp_path, pods)
    gpu_cluster.cluster.kubectl("apply", "-f", str(path))
    try:
        running = gpu_cluster.running_pods(NS, pods, timeout=90)
        assert len(running) == pods
        grown = offer(gpu_cluster)
        assert grown is not None and grown.gpu_count() >= before.gpu_count() + 2
    finally:
        gpu_cluster.cluster.kubectl("delete", "-f", str(path), "--wait=true", timeout=120)


@pytest.fixture
def unoffered_node(gpu_cluster: GpuCluster) -> Iterator[str]:
    """One more HGX node, started after the offer's spare set exists: none of its GPUs is in the offer (the
    spare set is full, and a new spare goes to a node that already offers MIG first)."""
    eventually(lambda: published_by_offer(gpu_cluster), 90, "every node publishing MIG by the offer")
    state = gpu_cluster.cluster.state_dir
    assert state is not None
    creds = components.driver_credentials(gpu_cluster.cluster, components.identities_dir(state.resolve()))
    sim = simnodes.SimNodes(
        state, gpu_cluster.cluster.kubeconfig, driver_credentials=creds, die_with_parent=True, out=lambda _: None
    )
    try:
        (node,) = sim.start([nodes.NodeGroup("hgx-h100", 1)])
        gpu_cluster.cluster.kubectl("label", "node", node.name, f"{WAIT_LABEL}=on", "--overwrite")
        yield node.name
    finally:
        sim.stop()


def test_a_mig_request_only_an_unoffered_gpu_can_serve_waits_is_told_and_runs(
    gpu_cluster: GpuCluster, unoffered_node: str, tmp_path: Path
) -> None:
    """Deterministic: the pod may only use a node none of whose GPUs is offered, so it cannot be allocated
    before the offer grows for its claim (after the grace), which tells the claim why it waits. The pod also
    asks for the MIG-offered label, which the node lacks until the offer grows onto it: kube-scheduler filters
    every other node out before its DRA allocator looks at any device (docs/mig-offer.md)."""
    current = offer(gpu_cluster)
    assert current is not None and not current.for_node(unoffered_node), current
    assert unoffered_node not in labelled(gpu_cluster)
    path = _manifest(tmp_path, 1, {WAIT_LABEL: "on", mig_offer.NODE_LABEL: mig_offer.NODE_LABEL_VALUE})
    gpu_cluster.cluster.kubectl("apply", "-f", str(path))
    try:

        def told() -> list[dict[str, Any]]:
            items = gpu_cluster.kubectl_json("get", "events", "-n", NS)["items"]
            return [e for e in items if e.get("reason") == "WaitingForMigOffer"]

        events = eventually(told, 30, "a WaitingForMigOffer Event")
        assert all(e["involvedObject"]["kind"] == "ResourceClaim" for e in events)
        assert all(e["message"].startswith(f"waiting for a MIG offer on {unoffered_node} ") for e in events), events
        (pod,) = gpu_cluster.running_pods(NS, 1, timeout=60)
        assert pod["spec"]["nodeName"] == unoffered_node
        grown = offer(gpu_cluster)
        assert grown is not None and len(grown.for_node(unoffered_node)) >= 1
        assert unoffered_node in labelled(gpu_cluster)
    finally:
        gpu_cluster.cluster.kubectl("delete", "-f", str(path), "--wait=true", timeout=120)
