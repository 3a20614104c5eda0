"""What each newer example must show on real nodes beyond the common checks of test_realnode_examples.

The same facts their stand-in tests assert (test_gang_templates, test_workload_api, test_extended_resources,
test_rightsize, test_imex_groups), read from the real nodes: the gang's members on the two real GB200 trays of one
NVLink domain through their own template claims, an unchanged ``nvidia.com/gpu`` pod on the
scheduler's claim for its extended resource, a GpuRequest's claim as the MPS share or MIG profile
the controller chose, a GpuRequest no GPU can meet refused with an Event, and an IMEX group's one domain
entry on both trays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from e2e.cluster import releases
from e2e.plane import report
from gpuplane.controller import names
from gpuplane.controller.claim.checks import EXTENDED_RESOURCE_CLAIM_ANNOTATION
from tests.e2e.conftest import eventually
from tests.e2e.realfixtures import RealCluster
from tests.e2e.test_scenarios import attr, results
from tests.e2e.test_workload_api import podgroup_condition

GIB = 2**30
Check = Callable[[RealCluster, str, list[dict[str, Any]]], list[str]]


def _gang_running(real: RealCluster, ns: str, gang: str) -> dict[str, Any] | None:
    status: dict[str, Any] = real.kubectl_json("get", "gpugang", "-n", ns, gang).get("status") or {}
    return status if status.get("phase") == "Running" else None


def _gang_on_real_trays(real: RealCluster, ns: str, gang: str, pods: list[dict[str, Any]]) -> list[str]:
    """Both members on different real GB200 trays of one domain, each through its own template claim."""
    devices = real.gpu.slice_devices()
    domains, nodes, lines = set(), set(), []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        node = pod["spec"]["nodeName"]
        nodes.add(node)
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]} in (
            terms["nodeSelectorTerms"][0]["matchExpressions"]
        ), "the controller narrowed the pod to the node it decided"
        assert names.SCHEDULING_GATE not in [g["name"] for g in pod["spec"].get("schedulingGates") or []]
        (claim_name,) = report.pod_claim_names(pod)
        assert claim_name.startswith(pod["metadata"]["name"] + "-gpus-"), "a claim made from the template"
        got = results(real.gpu.claim(ns, claim_name))
        assert len(got) == 4 and {r["pool"] for r in got} == {node}
        for r in got:
            assert attr(devices[(r["pool"], r["device"])], "productName") == "NVIDIA GB200"
            domains.add(attr(devices[(r["pool"], r["device"])], "nvlinkDomain"))
        lines.append(f"{pod['metadata']['name']} on {node}: {','.join(r['device'] for r in got)}")
    assert nodes == {n.name for n in real.of_profile("gb200-nvl72")}, "the gang did not span the real trays"
    assert len(domains) == 1, domains
    status = eventually(lambda: _gang_running(real, ns, gang), 60, f"gang {ns}/{gang} Running")
    assert status.get("domain") == next(iter(domains)), status
    placed = status["placement"]["members"]
    for pod in pods:  # member index = the Job's completion index (one pod per Job in a JobSet)
        labels = pod["metadata"]["labels"]
        index = labels.get("batch.kubernetes.io/job-completion-index")
        if gang == "tp8-jobset":
            index = labels["jobset.sigs.k8s.io/job-global-index"]
        assert placed[index] == pod["spec"]["nodeName"], (index, placed)
    assert (
        not [  # the controller made no <gang>-<i> claim of its own for template members
            c
            for c in real.kubectl_json("get", "resourceclaims", "-n", ns)["items"]
            if c["metadata"]["name"].startswith(f"{gang}-") and c["metadata"]["name"][len(gang) + 1 :].isdigit()
        ]
    )
    return [*lines, f"gang {ns}/{gang}: {status['phase']}, NVLink domain {status['domain']}"]


def gang_indexed_job(real: RealCluster, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    return _gang_on_real_trays(real, ns, "tp8-job", pods)


def gang_jobset(real: RealCluster, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    owners = {p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") for p in pods}
    assert owners == {"tp8-jobset"}, "the members are the JobSet's pods (made by the JobSet controller)"
    return _gang_on_real_trays(real, ns, "tp8-jobset", pods)


def nvidia_gpu_limits(real: RealCluster, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    """Unchanged ``nvidia.com/gpu`` pods: no resourceClaims, the limit as written, the scheduler's claim."""
    devices = real.gpu.slice_devices()
    lines = []
    for pod in pods:
        container = pod["spec"]["containers"][0]
        want = int(container["resources"]["limits"]["nvidia.com/gpu"])
        assert "resourceClaims" not in pod["spec"]
        status = pod["status"]["extendedResourceClaimStatus"]
        claim = real.gpu.claim(ns, status["resourceClaimName"])
        assert claim["metadata"]["annotations"][EXTENDED_RESOURCE_CLAIM_ANNOTATION] == "true"
        assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        got = results(claim)
        assert len(got) == want and {r["pool"] for r in got} == {pod["spec"]["nodeName"]}
        assert all(attr(devices[(r["pool"], r["device"])], "type") == "gpu" for r in got)
        assert status["requestMappings"] == [
            {"containerName": container["name"], "resourceName": "nvidia.com/gpu", "requestName": got[0]["request"]}
        ]
        if want > 1:
            assert len({attr(devices[(r["pool"], r["device"])], "nvlinkDomain") for r in got}) == 1
        lines.append(f"{pod['metadata']['name']}: nvidia.com/gpu={want} -> {[r['device'] for r in got]}")
    return lines


def right_sized(real: RealCluster, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    """The soft request as an MPS bronze share of 20 % and 12 GiB, the hard one as a MIG profile, too-big refused."""
    devices = real.gpu.slice_devices()
    lines = []
    for pod in pods:
        (entry,) = pod["status"]["resourceClaimStatuses"]
        claim = real.gpu.claim(ns, entry["resourceClaimName"])
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        record = real.checkpoint(real.node(pod["spec"]["nodeName"])).claims[claim["metadata"]["uid"]]
        if pod["metadata"]["name"].startswith("inference-"):
            assert result["request"] == "gpu/mps" and result.get("shareID")
            assert result["consumedCapacity"]["sharePercent"] == "20"
            assert record.sharing.strategy == "MPS" and record.mps_daemon
            assert record.sharing.mps_active_thread_percentage == 20
            assert set(record.sharing.mps_pinned_limits.values()) == {12 * GIB}
        else:
            assert pod["metadata"]["name"] == "training"
            assert result["request"].startswith("gpu/mig-"), result
            profile = attr(devices[(result["pool"], result["device"])], "migProfile")
            assert [d.mig.profile_name for d in record.devices if d.mig is not None] == [profile]
        lines.append(f"{pod['metadata']['name']}: {result['request']} on {result['pool']}/{result['device']}")

    def invalid() -> dict[str, Any] | None:
        r = real.kubectl_json("get", "gpurequest", "-n", ns, "too-big")
        return r if (r.get("status") or {}).get("phase") == "Invalid" else None

    refused = eventually(invalid, 60, "GpuRequest too-big Invalid")
    assert "500Gi is more than any GPU in the cluster has" in refused["status"]["message"]
    assert "too-big" not in real.kubectl("get", "resourceclaimtemplates", "-n", ns, "-o", "name")
    events = eventually(
        lambda: [
            e
            for e in real.kubectl_json("get", "events", "-n", ns)["items"]
            if e["involvedObject"]["name"] == "too-big" and e["reason"] == "InvalidGpuRequest"
        ],
        30,
        "InvalidGpuRequest Event",
    )
    assert events
    return [*lines, f"too-big: Invalid ({refused['status']['message'][:80]})"]


def _podgroup_on_real_trays(real: RealCluster, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    """The PodGroup scheduled as one: both pods on the two real GB200 trays, every GPU in one NVLink domain."""
    devices = real.gpu.slice_devices()
    domains, nodes, lines = set(), set(), []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        node = pod["spec"]["nodeName"]
        nodes.add(node)
        got = [r for name in report.pod_claim_names(pod) for r in results(real.gpu.claim(ns, name))]
        assert len(got) == 4 and {r["pool"] for r in got} == {node}, got
        domains |= {attr(devices[(r["pool"], r["device"])], "nvlinkDomain") for r in got}
        lines.append(f"{pod['metadata']['name']} on {node}: {','.join(r['device'] for r in got)}")
    assert nodes == {n.name for n in real.of_profile("gb200-nvl72")}, "the gang did not span the real trays"
    assert len(domains) == 1, domains
    cond = eventually(lambda: podgroup_condition(real.gpu, ns, "tp8-ranks"), 30, releases.RUNNING.podgroup_scheduled)
    assert cond["status"] == "True", cond
    return [*lines, f"PodGroup tp8-ranks: {cond['reason']}, NVLink domain {domains.pop()}"]


def gang_workload_api(real: RealCluster, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    return _podgroup_on_real_trays(real, ns, pods)


def gang_workload_steered(real: RealCluster, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    """As gang-workload-api, and gpuplane's GpuGang chose the nodes: each member where its placement says."""
    status = eventually(lambda: _gang_running(real, ns, "tp8"), 60, f"gang {ns}/tp8 Running")
    for pod in pods:
        index = pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        assert pod["spec"]["nodeName"] == status["placement"]["members"][index], (index, status["placement"])
    return [*_podgroup_on_real_trays(real, ns, pods), f"GpuGang tp8: {status['phase']} in {status['domain']}"]


def imex_group(real: RealCluster, ns: str, pods: list[dict[str, Any]]) -> list[str]:
    """One ``ImexDomain`` entry for the group, naming both ranks' claims on the two real trays with one channel,
    both trays ready (each rank's container sees that channel's node: ``realchecks.assert_sees_claim``)."""
    trays = sorted(n.name for n in real.of_profile("gb200-nvl72"))
    assert sorted(p["spec"]["nodeName"] for p in pods) == trays, "the group's ranks are not one per real tray"
    claims = {}
    for pod in pods:
        (status,) = pod["status"].get("resourceClaimStatuses") or []
        claims[real.gpu.claim(ns, status["resourceClaimName"])["metadata"]["uid"]] = pod["spec"]["nodeName"]

    def entry() -> tuple[dict[str, Any], dict[str, Any]] | None:
        for obj in real.kubectl_json("get", "imexdomains", "-n", "gpuplane-system").get("items", []):
            ready = {e["node"]: e.get("ready") for e in (obj.get("status") or {}).get("nodes") or []}
            for g in obj["spec"]["gangs"]:
                if (g["namespace"], g["name"]) == (ns, "train") and ready == dict.fromkeys(trays, True):
                    return obj, g
        return None

    obj, group = eventually(entry, 60, f"the ImexDomain entry of IMEX group {ns}/train, both trays ready")
    assert {c["uid"]: c["node"] for c in group["claims"]} == claims, (group["claims"], claims)
    assert obj["spec"]["nodes"] == trays
    return [f"IMEX group {ns}/train: ImexDomain {obj['metadata']['name']} on {trays}, channel {group['channel']}"]


CHECKS: dict[str, Check] = {
    "imex-group": imex_group,
    "gang-indexed-job": gang_indexed_job,
    "gang-jobset": gang_jobset,
    "gang-workload-api": gang_workload_api,
    "gang-workload-steered": gang_workload_steered,
    "nvidia-gpu-limits": nvidia_gpu_limits,
    "right-sized": right_sized,
}
