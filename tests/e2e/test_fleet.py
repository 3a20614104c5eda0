"""The fleet harness on the real control plane: KWOK nodes, the driver's publisher per node, the scheduler.

Four KWOK nodes (two HGX H100, two GB200 trays of one NVL72 rack) next to the session's simulated
nodes; their ResourceSlices published by ``e2e.plane.fleetslices`` (the driver's discovery and
publisher, each node under its own driver token). Checks that KWOK keeps them Ready, that the
pools are the driver's (5 slices on an HGX node, 3 on a tray) and allocatable (a MIG claim pod
bound to a fleet node and reported Running by KWOK, then deleted by it), that the own-node
admission policy holds for a fleet publisher, and that a health taint on one GPU rewrites one
slice at the same pool generation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.cluster import kwok
from e2e.plane import components, fleet, fleetslices
from gpuplane.driver.kube import KubeApi
from gpuplane.driver.publish.slices import DeviceTaint

pytestmark = pytest.mark.e2e

PREFIX = "fleet-t-"
NAMESPACE = "fleet-e2e"
GROUP, VERSION = "resource.k8s.io", "v1"


def _eventually(probe: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="module")
def fleet_up(
    control_plane: cluster.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[fleetslices.FleetSlices]:
    assert control_plane.state_dir is not None
    components.install(control_plane, out=lambda _: None)
    tool = kwok.Kwok(control_plane.state_dir, kwok.ensure_kwok(), control_plane.kubeconfig, die_with_parent=True)
    nodes = fleet.plan(2, 2, prefix=PREFIX)
    pub = fleetslices.FleetSlices(
        control_plane, nodes, tmp_path_factory.mktemp("fleet-sim"), workers=4, out=lambda _: None
    )
    tool.start()
    try:
        fleet.create_nodes(control_plane.api, nodes, out=lambda _: None)
        fleet.wait_ready(control_plane.api, nodes, timeout=120, out=lambda _: None)
        pub.mint_identities()
        pub.discover()
        pub.publish()
        yield pub
    finally:
        try:
            pub.unpublish()
            pub.remove_identities()
            fleet.delete_nodes(control_plane.api, nodes, out=lambda _: None)
        finally:
            tool.stop()


def _pool(control_plane: cluster.Cluster, node: str) -> list[dict[str, Any]]:
    listed = client.CustomObjectsApi(control_plane.api).list_cluster_custom_object(
        GROUP, VERSION, "resourceslices", field_selector=f"spec.nodeName={node}"
    )
    return list(listed["items"])  # type: ignore[index]


def test_kwok_nodes_carry_the_drivers_pools(control_plane: cluster.Cluster, fleet_up: fleetslices.FleetSlices) -> None:
    assert not fleet.not_ready(control_plane.api, fleet_up.pools)
    for name, pool in fleet_up.pools.items():
        got = _pool(control_plane, name)
        assert len(got) == (5 if pool.node.profile == fleet.HGX_PROFILE else 3)
        assert {s["spec"]["pool"]["generation"] for s in got} == {1}
        devices = sum(len(s["spec"].get("devices") or []) for s in got)
        assert devices == (208 if pool.node.profile == fleet.HGX_PROFILE else 104)
    trays = [p.node.name for p in fleet_up.pools.values() if p.node.profile == fleet.GB200_PROFILE]
    domains = {
        d["attributes"]["nvlinkDomain"]["string"]
        for t in trays
        for s in _pool(control_plane, t)
        for d in s["spec"].get("devices") or []
        if d["attributes"]["type"]["string"] == "gpu"
    }
    assert len(domains) == 1  # the two trays of one rack share an NVLink domain
    who = fleet_up.whoami(trays[0])
    assert who["extra"]["authentication.kubernetes.io/node-name"] == [trays[0]]


def test_a_fleet_publisher_cannot_write_another_nodes_slices(
    control_plane: cluster.Cluster, fleet_up: fleetslices.FleetSlices
) -> None:
    first, second = list(fleet_up.pools)[:2]
    victim = _pool(control_plane, second)[0]
    api = fleet_up.client_for(fleet_up.pools[first].token)  # the node's own token, as its driver has it
    try:
        with pytest.raises(ApiException) as refused:
            KubeApi(api).delete_slice(victim["metadata"]["name"])
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert refused.value.status == 403
    # both slice policies refuse a node's token writing another node's slice (the driver's, bound to its
    # ServiceAccount, and gpuplane-own-node-slices, for every writer); the API server names whichever it ran first
    body = str(refused.value.body)
    assert (
        f"may not modify or delete ResourceSlices of node '{second}'" in body
        or f"not slice '{victim['metadata']['name']}' of node '{second}'" in body
    ), body


def test_a_mig_claim_pod_runs_on_a_kwok_node(control_plane: cluster.Cluster, fleet_up: fleetslices.FleetSlices) -> None:
    core, custom = client.CoreV1Api(control_plane.api), client.CustomObjectsApi(control_plane.api)
    node = next(p.node.name for p in fleet_up.pools.values() if p.node.profile == fleet.HGX_PROFILE)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    except ApiException as err:
        if err.status != 409:
            raise
    _eventually(
        lambda: core.list_namespaced_service_account(NAMESPACE, field_selector="metadata.name=default").items,
        60,
        "the default ServiceAccount",
    )
    claim = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": "mig", "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": "mig.gpuplane.dev",
                            "selectors": [
                                {"cel": {"expression": 'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"'}}
                            ],
                        },
                    }
                ]
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mig", "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpus", "resourceClaimName": "mig"}],
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpus"}]}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "resourceclaims", claim)
    core.create_namespaced_pod(NAMESPACE, pod)  # type: ignore[arg-type]
    try:
        running = _eventually(
            lambda: (p := core.read_namespaced_pod("mig", NAMESPACE)).status.phase == "Running" and p,
            120,
            "the MIG pod Running (scheduled by kube-scheduler, run by KWOK)",
        )
        assert running.spec.node_name == node
        got = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "resourceclaims", "mig")
        (result,) = got["status"]["allocation"]["devices"]["results"]  # type: ignore[index]
        assert result["pool"] == node and "-mig-1g-10gb-" in result["device"]
    finally:
        core.delete_namespaced_pod("mig", NAMESPACE, grace_period_seconds=0)
        _eventually(lambda: not core.list_namespaced_pod(NAMESPACE).items, 60, "KWOK to delete the pod")
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "resourceclaims", "mig")


def test_a_health_taint_rewrites_one_slice_at_the_same_generation(
    control_plane: cluster.Cluster, fleet_up: fleetslices.FleetSlices
) -> None:
    node = next(p.node.name for p in fleet_up.pools.values() if p.node.profile == fleet.HGX_PROFILE)
    before = {s["metadata"]["name"]: s for s in _pool(control_plane, node)}
    taint = DeviceTaint(key="gpu.gpuplane.dev/xid", value="xid-94", effect="NoSchedule")
    fleet_up.set_taints(node, {"gpu-5": [taint]})
    try:
        done = fleet_up.publish([node])
        assert done.calls == {"list": 1, "update": 1}
        after = {s["metadata"]["name"]: s for s in _pool(control_plane, node)}
        changed = [
            n for n in after if after[n]["metadata"]["resourceVersion"] != before[n]["metadata"]["resourceVersion"]
        ]
        assert len(changed) == 1
        assert {s["spec"]["pool"]["generation"] for s in after.values()} == {1}
        tainted = [d for d in after[changed[0]]["spec"]["devices"] if d.get("taints")]
        assert tainted and {d["name"].split("-mig-")[0] for d in tainted} == {"gpu-5"}
    finally:
        fleet_up.set_taints(node, {})
        fleet_up.publish([node])
    assert json.dumps(sorted(s["spec"]["pool"]["generation"] for s in _pool(control_plane, node))) == "[1, 1, 1, 1, 1]"


def test_sim_state_is_per_node(fleet_up: fleetslices.FleetSlices) -> None:
    assert sorted(p.name for p in Path(fleet_up.sim_root).iterdir()) == sorted(fleet_up.pools)
