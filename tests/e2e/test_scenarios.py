"""Every example in manifests/examples, applied as its README says, on simulated GPU nodes.

Each test applies one scenario folder with ``kubectl apply -f``, then checks
what the real kube-scheduler allocated (claim ``status.allocation``: devices,
pool, constraints honoured), what the node driver recorded (its checkpoint)
and wrote (CDI specs), and what it did to the simulated hardware (MIG
instances). Teardown deletes the scenario with ``kubectl delete -f`` and
checks that every node is clean again: no prepared claim, no CDI spec, no MIG
instance. The nodes (two HGX H100, two GB200 trays of one rack) and the
controller (for ``gang-tp8``) are shared by the whole session.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import handle as cluster
from e2e.cluster import procs
from e2e.plane import components, identity, report, simnodes
from gpuplane.api import names
from gpuplane.driver.prepare import cdi
from gpuplane.driver.sharing.mps import MpsControl
from tests.e2e.conftest import GpuCluster, eventually

pytestmark = pytest.mark.e2e

D = names.DRIVER_NAME


def attr(device: dict[str, Any], name: str) -> Any:
    """A device attribute's value by its short name (published unqualified, or qualified with the driver's domain)."""
    attributes = device["attributes"]
    return report.attr_value(attributes.get(name) or attributes[f"{D}/{name}"])


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's allocation results."""
    return list(claim["status"]["allocation"]["devices"]["results"])


def claim_of(gpu: GpuCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The (single) claim a pod uses."""
    (claim_name,) = report.pod_claim_names(pod)
    return gpu.claim(pod["metadata"]["namespace"], claim_name)


def assert_prepared(gpu: GpuCluster, node: simnodes.SimNode, claim: dict[str, Any]) -> None:
    """The node's checkpoint has the claim completed with its allocated devices; every CDI id resolves."""
    uid = claim["metadata"]["uid"]
    record = gpu.checkpoint(node).claims.get(uid)
    assert record is not None, f"claim {claim['metadata']['name']} is not in {node.name}'s checkpoint"
    assert record.phase == "PrepareCompleted"
    assert sorted(d.device for d in record.devices) == sorted(r["device"] for r in results(claim))
    assert cdi.spec_path(node.cdi_root, uid).is_file()
    for device in record.devices:
        assert device.cdi_ids
        for cdi_id in device.cdi_ids:
            assert cdi.resolve(node.cdi_root, cdi_id) == cdi.spec_path(node.cdi_root, uid)


@pytest.fixture
def example(gpu_cluster: GpuCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """Apply the example named by the test's parameter; delete it afterwards and check the nodes are clean."""
    with gpu_cluster.example_applied(str(request.param), clean_within=30) as name:
        yield name


def test_nodes_are_ready_and_publish_their_gpus(gpu_cluster: GpuCluster) -> None:
    node_list = gpu_cluster.kubectl_json("get", "nodes")["items"]
    ready = {
        n["metadata"]["name"]
        for n in node_list
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    }
    assert {n.name for n in gpu_cluster.nodes} <= ready
    devices = gpu_cluster.slice_devices()
    domains: dict[str, set[str]] = {}
    for node in gpu_cluster.nodes:
        gpus = {name: d for (pool, name), d in devices.items() if pool == node.name and attr(d, "type") == "gpu"}
        expected = 8 if node.profile == "hgx-h100" else 4
        assert len(gpus) == expected, node.name
        for device in gpus.values():
            assert device["allowMultipleAllocations"] is True
            assert device["capacity"]["sharePercent"]["value"] == "100"
            domains.setdefault(node.name, set()).add(attr(device, "nvlinkDomain"))
    # HGX: one domain per board; GB200: one domain across the rack's trays.
    for node in gpu_cluster.of_profile("hgx-h100"):
        assert domains[node.name] == {f"{node.name}.nvl0"}
    trays = gpu_cluster.of_profile("gb200-nvl72")
    assert len(trays) == 2 and len(set.union(*(domains[n.name] for n in trays))) == 1


def test_drivers_and_controllers_run_as_their_service_accounts(gpu_cluster: GpuCluster) -> None:
    """As ``python -m e2e up`` runs them: no workload pod, each process under its own token."""
    handle = gpu_cluster.cluster
    assert handle.state_dir is not None
    records = procs.read_records(handle.state_dir / "pids")

    def whoami(process: str) -> dict[str, Any]:
        (kubeconfig,) = [a.split("=", 1)[1] for a in records[process].argv if a.startswith("--kubeconfig=")]
        api = identity.new_client(Path(kubeconfig))
        try:
            return identity.whoami(api)
        finally:
            api.close()

    for node in gpu_cluster.nodes:
        me = whoami(node.driver_process)
        assert me["username"] == identity.username(identity.NAMESPACE, identity.DRIVER_SA)
        assert me["extra"][identity.NODE_NAME_EXTRA] == [node.name]
    replicas = sorted(components.controller_records(handle.state_dir))
    assert len(replicas) == 2
    for name in replicas:
        assert whoami(name)["username"] == identity.username(identity.NAMESPACE, identity.CONTROLLER_SA)
    assert components.lease_holder(handle.api) in {components.Controllers.replica_name(i) for i in range(2)}
    # The DaemonSet and the Deployment are installed but place no pod (no container runtime here):
    # the only pods on our nodes are the drivers' identity anchors, one per node, still there.
    # (Other modules' base installs may leave controller pods on nodes that are gone by now.)
    ours = {n.name for n in gpu_cluster.nodes}
    pods = [p for p in gpu_cluster.pods(identity.NAMESPACE) if p["spec"].get("nodeName") in ours]
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(
        f"{identity.DRIVER_SA}-identity-{n.name}" for n in gpu_cluster.nodes
    )
    ds = gpu_cluster.kubectl_json("get", "daemonset", "-n", identity.NAMESPACE, "gpuplane-driver")
    assert ds["status"]["desiredNumberScheduled"] == 0


@pytest.mark.parametrize("example", ["whole-gpu"], indirect=True)
def test_whole_gpu(gpu_cluster: GpuCluster, example: str) -> None:
    pods = gpu_cluster.running_pods("gpuplane-ex-whole-gpu", 2)
    seen = set()
    for pod in pods:
        claim = claim_of(gpu_cluster, pod)
        (result,) = results(claim)
        node = gpu_cluster.node(pod["spec"]["nodeName"])
        assert result["driver"] == D and result["pool"] == node.name
        assert result["consumedCapacity"]["sharePercent"] == "100"  # no share requested: exclusive
        assert attr(gpu_cluster.slice_devices()[(result["pool"], result["device"])], "type") == "gpu"
        seen.add((result["pool"], result["device"]))
        assert_prepared(gpu_cluster, node, claim)
        assert gpu_cluster.checkpoint(node).claims[claim["metadata"]["uid"]].sharing.strategy == "Exclusive"
    assert len(seen) == 2, "two pods got the same GPU"


@pytest.mark.parametrize("example", ["shared-claim"], indirect=True)
def test_shared_claim(gpu_cluster: GpuCluster, example: str) -> None:
    namespace = "gpuplane-ex-shared-claim"
    pods = gpu_cluster.running_pods(namespace, 2)
    assert len({p["spec"]["nodeName"] for p in pods}) == 1
    node = gpu_cluster.node(pods[0]["spec"]["nodeName"])
    claim = gpu_cluster.claim(namespace, "shared-gpu")
    assert {r["uid"] for r in claim["status"]["reservedFor"]} == {p["metadata"]["uid"] for p in pods}
    assert_prepared(gpu_cluster, node, claim)
    assert len(gpu_cluster.checkpoint(node).claims) == 1
    # One user gone: the claim stays prepared for the other.
    gpu_cluster.cluster.kubectl("delete", "pod", "-n", namespace, "consumer", "--wait=true")
    assert_prepared(gpu_cluster, node, claim)
    assert gpu_cluster.pod(namespace, "producer")["status"]["phase"] == "Running"


@pytest.mark.parametrize("example", ["mig-two-profiles"], indirect=True)
def test_mig_two_profiles(gpu_cluster: GpuCluster, example: str) -> None:
    namespace = "gpuplane-ex-mig-two-profiles"
    (pod,) = gpu_cluster.running_pods(namespace, 1)
    node = gpu_cluster.node(pod["spec"]["nodeName"])
    assert node.profile == "hgx-h100"
    claim = gpu_cluster.claim(namespace, "two-slices")
    assert claim["spec"]["devices"]["constraints"] == [
        {"requests": ["big", "small"], "matchAttribute": f"{D}/parentUUID"}
    ]
    by_request = {r["request"]: r for r in results(claim)}
    devices = gpu_cluster.slice_devices()
    big, small = (devices[(by_request[r]["pool"], by_request[r]["device"])] for r in ("big", "small"))
    assert (attr(big, "migProfile"), attr(small, "migProfile")) == ("3g.40gb", "2g.20gb")
    assert attr(big, "parentUUID") == attr(small, "parentUUID")
    assert_prepared(gpu_cluster, node, claim)
    record = gpu_cluster.checkpoint(node).claims[claim["metadata"]["uid"]]
    migs = sorted((d.mig.profile_name, d.mig.start, d.mig.size) for d in record.devices if d.mig is not None)
    assert [m[0] for m in migs] == ["2g.20gb", "3g.40gb"]
    (a_start, a_size), (b_start, b_size) = ((m[1], m[2]) for m in migs)
    assert a_start + a_size <= b_start or b_start + b_size <= a_start, f"overlapping placements {migs}"
    # The instances exist in the simulated GPU, at the allocated placements.
    gis = gpu_cluster.sim_state(node)["gpus"][attr(big, "parentUUID")]["gis"]
    assert sorted((g["start"], g["size"]) for g in gis) == sorted((m[1], m[2]) for m in migs)
    assert all(g["cis"] for g in gis), "every GPU instance has its compute instance"


@pytest.mark.parametrize("example", ["mps-tiers"], indirect=True)
def test_mps_tiers(gpu_cluster: GpuCluster, example: str) -> None:
    namespace = "gpuplane-ex-mps-tiers"
    pods = gpu_cluster.running_pods(namespace, 2)
    assert len({p["spec"]["nodeName"] for p in pods}) == 1
    node = gpu_cluster.node(pods[0]["spec"]["nodeName"])
    gold, bronze = (gpu_cluster.claim(namespace, n) for n in ("gold", "bronze"))
    (g,), (b,) = results(gold), results(bronze)
    assert (g["pool"], g["device"]) == (b["pool"], b["device"]), "the tiers did not share one GPU"
    assert g["shareID"] and b["shareID"] and g["shareID"] != b["shareID"]
    assert (g["consumedCapacity"]["sharePercent"], b["consumedCapacity"]["sharePercent"]) == ("60", "20")
    checkpoint = gpu_cluster.checkpoint(node)
    mps = MpsControl(node.mps_root, str(simnodes.MPS_STANDIN))
    for claim, percent, pinned in ((gold, 60, 48), (bronze, 20, 16)):
        assert_prepared(gpu_cluster, node, claim)
        record = checkpoint.claims[claim["metadata"]["uid"]]
        assert record.sharing.strategy == "MPS"
        assert record.sharing.mps_active_thread_percentage == percent
        assert set(record.sharing.mps_pinned_limits.values()) == {pinned * 2**30}
        assert mps.alive(claim["metadata"]["uid"]), "no MPS daemon for the claim"


@pytest.mark.parametrize("example", ["nvlink-4gpu"], indirect=True)
def test_nvlink_4gpu(gpu_cluster: GpuCluster, example: str) -> None:
    namespace = "gpuplane-ex-nvlink-4gpu"
    (pod,) = gpu_cluster.running_pods(namespace, 1)
    node = gpu_cluster.node(pod["spec"]["nodeName"])
    claim = gpu_cluster.claim(namespace, "four-gpus")
    found = results(claim)
    assert len(found) == 4 and len({r["device"] for r in found}) == 4
    devices = gpu_cluster.slice_devices()
    assert len({attr(devices[(r["pool"], r["device"])], "nvlinkDomain") for r in found}) == 1
    assert_prepared(gpu_cluster, node, claim)


@pytest.mark.parametrize("example", ["gang-tp8"], indirect=True)
def test_gang_tp8(gpu_cluster: GpuCluster, example: str) -> None:
    namespace = "gpuplane-ex-gang-tp8"
    pods = gpu_cluster.running_pods(namespace, 2, timeout=120)

    def running_status() -> dict[str, Any] | None:
        status: dict[str, Any] = gpu_cluster.kubectl_json("get", "gpugang", "-n", namespace, "tp8").get("status") or {}
        return status if status.get("phase") == "Running" else None

    status = eventually(running_status, 30, "gang tp8 to report Running")  # status follows the pods
    assert status["placedMembers"] == 2, status
    # Two members of 4 GPUs: the two GB200 trays of the rack, one member each, one NVLink domain.
    trays = {n.name for n in gpu_cluster.of_profile("gb200-nvl72")}
    assert {p["spec"]["nodeName"] for p in pods} == trays
    assert status["placement"]["members"] == {p["metadata"]["name"][-1]: p["spec"]["nodeName"] for p in pods}
    devices = gpu_cluster.slice_devices()
    for pod in pods:
        assert not pod["spec"].get("schedulingGates")
        claim = claim_of(gpu_cluster, pod)
        assert claim["metadata"]["name"] == f"tp8-{pod['metadata']['name'][-1]}"
        found = results(claim)
        assert len(found) == 4 and {r["pool"] for r in found} == {pod["spec"]["nodeName"]}
        assert {attr(devices[(r["pool"], r["device"])], "nvlinkDomain") for r in found} == {status["domain"]}
        assert_prepared(gpu_cluster, gpu_cluster.node(pod["spec"]["nodeName"]), claim)


@pytest.mark.parametrize("example", ["unsatisfiable"], indirect=True)
def test_unsatisfiable(gpu_cluster: GpuCluster, example: str) -> None:
    namespace = "gpuplane-ex-unsatisfiable"

    def reasons() -> dict[str, str] | None:
        events = gpu_cluster.kubectl_json("get", "events", "-n", namespace)["items"]
        found = {e["involvedObject"]["name"]: e["message"] for e in events if e["reason"] == "FailedScheduling"}
        return found if {"too-big", "wrong-profile"} <= set(found) else None

    messages = eventually(reasons, 60, "FailedScheduling events")
    assert all("cannot allocate all claims" in m for m in messages.values()), messages
    time.sleep(2)
    for name in ("too-big", "wrong-profile"):
        pod = gpu_cluster.pod(namespace, name)
        assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
        (scheduled,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    for claim in ("sixteen-gpus", "no-such-profile"):
        assert not (gpu_cluster.claim(namespace, claim).get("status") or {}).get("allocation")


@pytest.mark.parametrize("example", ["unprepare-cleanup"], indirect=True)
def test_unprepare_cleanup(gpu_cluster: GpuCluster, example: str) -> None:
    namespace = "gpuplane-ex-unprepare-cleanup"
    (pod,) = gpu_cluster.running_pods(namespace, 1)
    node = gpu_cluster.node(pod["spec"]["nodeName"])
    claim = claim_of(gpu_cluster, pod)
    uid = claim["metadata"]["uid"]
    assert_prepared(gpu_cluster, node, claim)
    (device,) = gpu_cluster.checkpoint(node).claims[uid].devices
    assert device.mig is not None and device.mig.profile_name == "1g.10gb"
    parent = device.mig.parent_uuid
    assert [g["start"] for g in gpu_cluster.sim_state(node)["gpus"][parent]["gis"]] == [device.mig.start]

    gpu_cluster.cluster.kubectl("delete", "pod", "-n", namespace, "short-lived", "--wait=true")
    assert gpu_cluster.sim_state(node)["gpus"][parent]["gis"] == [], "MIG instance left after unprepare"
    assert not cdi.spec_path(node.cdi_root, uid).exists(), "CDI spec left after unprepare"
    assert uid not in gpu_cluster.checkpoint(node).claims
    claims = gpu_cluster.kubectl_json("get", "resourceclaims", "-n", namespace)["items"]
    eventually(
        lambda: not gpu_cluster.kubectl_json("get", "resourceclaims", "-n", namespace)["items"],
        30,
        f"generated claim deleted (had {[c['metadata']['name'] for c in claims]})",
    )


def test_failed_prepare_is_a_pod_event_and_pods_without_claims_run(gpu_cluster: GpuCluster) -> None:
    """A config wrong on its own is refused at creation; one only the class shows wrong fails its pod fast."""
    namespace = "gpuplane-e2e-failed-prepare"
    refused_config = {
        "apiVersion": names.CONFIG_API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "mps": {"defaultActiveThreadPercentage": 10}},
    }
    class_mismatch = {"apiVersion": names.CONFIG_API_VERSION, "kind": "MigDeviceConfig"}  # on the whole-GPU class

    def claim(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}],
                    "config": [{"opaque": {"driver": D, "parameters": parameters}}],
                }
            },
        }

    manifest = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        claim("bad", class_mismatch),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bad-config", "namespace": namespace},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "bad"}],
                "containers": [
                    {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "no-claims", "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        },
    ]
    text = "\n---\n".join(json.dumps(m) for m in manifest)
    gpu_cluster.cluster.apply(text)
    try:
        with pytest.raises(cluster.KubectlError, match="gpuplane-claim-configs") as refused:
            gpu_cluster.cluster.apply(claim("refused", refused_config))
        assert "timeSlicing goes with TimeSlicing" in str(refused.value) or "mps with MPS" in str(refused.value)
        eventually(
            lambda: gpu_cluster.pod(namespace, "no-claims")["status"].get("phase") == "Running", 60, "plain pod Running"
        )

        def failed() -> dict[str, Any] | None:
            pod = gpu_cluster.pod(namespace, "bad-config")
            return pod if pod["status"].get("phase") == "Failed" else None

        pod = eventually(failed, 60, "the pod of the invalid claim to fail")
        assert pod["status"]["reason"] == "InvalidDeviceConfig"
        assert "MigDeviceConfig" in pod["status"]["message"] and "Fix the claim" in pod["status"]["message"]
        eventually(
            lambda: not (gpu_cluster.claim(namespace, "bad").get("status") or {}).get("allocation"),
            60,
            "the invalid claim's device released",
        )
    finally:
        gpu_cluster.cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s", timeout=150)
    eventually(gpu_cluster.nodes_are_clean, 30, "nodes clean")
