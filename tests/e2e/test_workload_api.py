"""The upstream Workload API (scheduling.k8s.io/v1beta1; v1alpha2 on 1.36) on gpuplane nodes: alone, and steered.

``gang-workload-api``: a Workload and a PodGroup (gang ``minCount: 2``,
topology key ``gpuplane.dev/nvlink-domain``) and an Indexed Job whose pods
point at the PodGroup; kube-scheduler places the gang all or nothing in one
NVLink domain and allocates the claims through DRA. No gpuplane code is on the
decision path: the pods carry no gang label or gate, the controller touches
none of them (no affinity is added), and with three members that cannot share a
domain no pod binds at all, though two would fit.

``gang-workload-steered``: the same objects plus a GpuGang and the gang label
and gate in the template: gpuplane-controller picks the nodes and narrows the
pods, kube-scheduler still schedules the PodGroup.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from e2e.cluster import releases
from e2e.plane import report
from gpuplane.controller import names
from tests.e2e.conftest import EXAMPLES, GpuCluster, eventually
from tests.e2e.test_gang_templates import wait_phase
from tests.e2e.test_scenarios import assert_prepared, attr, results

pytestmark = pytest.mark.e2e


def podgroup_condition(gpu: GpuCluster, ns: str, name: str) -> dict[str, Any] | None:
    pg = gpu.kubectl_json("get", "podgroups.scheduling.k8s.io", "-n", ns, name)
    for c in (pg.get("status") or {}).get("conditions") or []:
        if c["type"] == releases.RUNNING.podgroup_scheduled:
            return dict(c)
    return None


def domains_of(gpu: GpuCluster, pods: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    devices = gpu.slice_devices()
    domains, nodes = set(), set()
    for pod in pods:
        (name,) = report.pod_claim_names(pod)
        claim = gpu.claim(pod["metadata"]["namespace"], name)
        got = results(claim)
        assert len(got) == 4 and {r["pool"] for r in got} == {pod["spec"]["nodeName"]}
        assert_prepared(gpu, gpu.node(pod["spec"]["nodeName"]), claim)
        nodes.add(pod["spec"]["nodeName"])
        domains |= {attr(devices[(r["pool"], r["device"])], "nvlinkDomain") for r in got}
    return domains, nodes


@pytest.fixture
def example(gpu_cluster: GpuCluster, request: pytest.FixtureRequest) -> Any:
    with gpu_cluster.example_applied(str(request.param)) as name:
        yield name


@pytest.mark.parametrize("example", ["gang-workload-api"], indirect=True)
def test_the_scheduler_alone_places_a_podgroup_gang_in_one_domain(gpu_cluster: GpuCluster, example: str) -> None:
    ns = "gpuplane-ex-gang-workload-api"
    pods = gpu_cluster.running_pods(ns, 2)
    for pod in pods:
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "tp8-ranks"}
        assert names.LABEL_GANG not in (pod["metadata"].get("labels") or {})
        assert "affinity" not in pod["spec"], "nobody but the scheduler decided where this pod goes"
    domains, nodes = domains_of(gpu_cluster, pods)
    assert len(domains) == 1 and len(nodes) == 2
    cond = eventually(lambda: podgroup_condition(gpu_cluster, ns, "tp8-ranks"), 30, releases.RUNNING.podgroup_scheduled)
    assert cond["status"] == "True", cond
    print(f"\nPodGroup tp8-ranks: {cond['reason']}; pods on {sorted(nodes)}; NVLink domain {domains.pop()}")


def test_the_scheduler_places_a_podgroup_all_or_nothing(gpu_cluster: GpuCluster) -> None:
    """Three members of 4 GB200 GPUs cannot share the rack's 8: none binds, though two would fit."""
    ns = "workload-never-fits"
    docs = list(yaml.safe_load_all((EXAMPLES / "gang-workload-api" / "gang-workload-api.yaml").read_text()))
    for doc in docs:
        doc["metadata"]["namespace"] = ns
        if doc["kind"] == "Namespace":
            doc["metadata"] = {"name": ns}
        elif doc["kind"] == "Workload":
            doc["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"] = 3
        elif doc["kind"] == "PodGroup":
            doc["spec"]["schedulingPolicy"]["gang"]["minCount"] = 3
        elif doc["kind"] == "Job":
            doc["spec"].update(completions=3, parallelism=3)
    handle = gpu_cluster.cluster
    handle.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))
    try:

        def refused() -> dict[str, Any] | None:
            cond = podgroup_condition(gpu_cluster, ns, "tp8-ranks")
            return cond if cond and cond["status"] == "False" else None

        cond = eventually(refused, 60, "the PodGroup to be unschedulable")
        time.sleep(3)
        pods = gpu_cluster.pods(ns)
        assert len(pods) == 3 and all(not p["spec"].get("nodeName") for p in pods)
        claims = gpu_cluster.kubectl_json("get", "resourceclaims", "-n", ns)["items"]
        assert all(not (c.get("status") or {}).get("allocation") for c in claims)
        print(f"\nPodGroup with 3 x 4 GB200: {cond['reason']}: {cond['message']}; 0 of 3 pods bound")
    finally:
        handle.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)
        eventually(gpu_cluster.nodes_are_clean, 60, "nodes clean")


@pytest.mark.parametrize("example", ["gang-workload-steered"], indirect=True)
def test_gpuplane_steers_a_podgroup_gang(gpu_cluster: GpuCluster, example: str) -> None:
    ns = "gpuplane-ex-gang-workload-steered"
    st = wait_phase(gpu_cluster, ns, "tp8", "Running")
    pods = gpu_cluster.running_pods(ns, 2)
    for pod in pods:
        index = pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        assert pod["spec"]["nodeName"] == st["placement"]["members"][index]
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][-1]["values"] == [pod["spec"]["nodeName"]]
    domains, nodes = domains_of(gpu_cluster, pods)
    assert domains == {st["domain"]} and len(nodes) == 2
    cond = eventually(lambda: podgroup_condition(gpu_cluster, ns, "tp8-ranks"), 30, releases.RUNNING.podgroup_scheduled)
    assert cond["status"] == "True", cond
    print(f"\nsteered: GpuGang {st['phase']} in {st['domain']}, PodGroup {cond['reason']}, pods on {sorted(nodes)}")
