"""Gangs whose pods come from one template: an Indexed Job, a JobSet and a LeaderWorkerSet, TP=8 across two trays.

The examples ``gang-indexed-job``, ``gang-jobset`` and ``gang-leaderworkerset``
are applied as their READMEs say. Their pods carry the gang label and gate from the template, get
their claims from a ResourceClaimTemplate, and are placed by gpuplane-controller
all or nothing in one NVLink domain by narrowing each pod's node affinity; the
real kube-scheduler allocates the claims on the chosen trays and the node
drivers prepare them. Then the failure semantics: a member that fails makes its
Job give up and the whole gang's devices go back; a suspended Job releases them
and gets them back when resumed; a member deleted while the Job still retries is
replaced and rejoins on its node; a gang that can never fit is refused, with the
reason on the GpuGang and as an Event on its Job; one that times out has its
Job suspended (nothing left waiting gated) and a GangTimedOut Event on the Job.
A LeaderWorkerSet's group (leader and worker) is one gang; a deleted worker makes
LWS recreate the whole group, which rejoins the gang's trays; deleting the LWS
releases the gang.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.cluster import addons
from e2e.cluster.handle import KubectlError
from e2e.plane import report
from gpuplane.controller import events, names
from tests.e2e import gangkit
from tests.e2e.conftest import EXAMPLES, GpuCluster, eventually
from tests.e2e.test_scenarios import assert_prepared, attr, results

pytestmark = pytest.mark.e2e

FAILED_STATUS = {
    "status": {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "rank",
                "image": "registry.k8s.io/pause:3.10",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
            }
        ],
    }
}


def gang_status(gpu: GpuCluster, ns: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = gpu.kubectl_json("get", "gpugang", "-n", ns, name).get("status") or {}
    return status


def wait_phase(gpu: GpuCluster, ns: str, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        st = gang_status(gpu, ns, name)
        return st if st.get("phase") == phase else None

    return eventually(probe, timeout, f"gang {ns}/{name} to be {phase}")


def events_on(gpu: GpuCluster, ns: str, kind: str, name: str) -> list[dict[str, Any]]:
    items = gpu.kubectl_json("get", "events", "-n", ns).get("items", [])
    return [e for e in items if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name]


def assert_one_domain_gang(gpu: GpuCluster, ns: str, gang: str, pods: list[dict[str, Any]]) -> list[str]:
    """Both members bound to different GB200 trays of one domain, each through its own template claim."""
    st = gang_status(gpu, ns, gang)
    devices = gpu.slice_devices()
    lines = []
    domains = set()
    nodes = set()
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
        claim = gpu.claim(ns, claim_name)
        got = results(claim)
        assert len(got) == 4 and {r["pool"] for r in got} == {node}
        for r in got:
            device = devices[(r["pool"], r["device"])]
            assert attr(device, "productName") == "NVIDIA GB200"
            domains.add(attr(device, "nvlinkDomain"))
        assert_prepared(gpu, gpu.node(node), claim)
        lines.append(f"{pod['metadata']['name']:32} {node:15} {','.join(r['device'] for r in got)}")
    assert len(nodes) == 2 and len(domains) == 1, (nodes, domains)
    assert st["domain"] == next(iter(domains))
    # The controller made no <gang>-<i> claim of its own for template members.
    assert not [
        c
        for c in gpu.kubectl_json("get", "resourceclaims", "-n", ns)["items"]
        if c["metadata"]["name"].startswith(f"{gang}-") and c["metadata"]["name"][len(gang) + 1 :].isdigit()
    ]
    lines.append(f"gang {ns}/{gang}: {st['phase']}, NVLink domain {st['domain']}")
    return lines


@pytest.fixture
def applied(gpu_cluster: GpuCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with gpu_cluster.example_applied(str(request.param)) as name:
        yield name


def fail_pod(gpu: GpuCluster, ns: str, pod: str) -> None:
    """What kubelet writes when the container exits with 1."""
    gpu.cluster.kubectl(
        "patch",
        "pod",
        "-n",
        ns,
        pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(FAILED_STATUS),
    )


def assert_released(gpu: GpuCluster, ns: str, gang: str, reason: str) -> dict[str, Any]:
    st = wait_phase(gpu, ns, gang, "Released")
    assert st["reason"] == reason and "the gang's devices are released" in st["message"], st
    assert "placement" not in st or not st["placement"]
    eventually(lambda: not gpu.kubectl_json("get", "resourceclaims", "-n", ns)["items"], 60, "every claim gone")
    eventually(lambda: not [p for p in gpu.pods(ns) if p["status"].get("phase") == "Running"], 60, "no pod running")
    eventually(gpu.nodes_are_clean, 60, "nodes clean: every GPU of the gang unprepared")
    return st


@pytest.mark.parametrize("applied", ["gang-indexed-job"], indirect=True)
def test_indexed_job_tp8_gang_in_one_domain_released_when_a_member_fails(gpu_cluster: GpuCluster, applied: str) -> None:
    ns, gang = "gpuplane-ex-gang-indexed-job", "tp8-job"
    wait_phase(gpu_cluster, ns, gang, "Running")
    pods = gpu_cluster.running_pods(ns, 2)
    print("\n" + "\n".join(assert_one_domain_gang(gpu_cluster, ns, gang, pods)))
    indices = sorted(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods)
    placed = gang_status(gpu_cluster, ns, gang)["placement"]["members"]
    for pod in pods:
        index = pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        assert placed[index] == pod["spec"]["nodeName"]  # member index = completion index
    assert indices == ["0", "1"]
    victim = sorted(p["metadata"]["name"] for p in pods)[0]
    fail_pod(gpu_cluster, ns, victim)
    st = assert_released(gpu_cluster, ns, gang, events.GANG_OWNER_FAILED)
    assert "Job tp8-job failed" in st["message"]
    job_events = [e["reason"] for e in events_on(gpu_cluster, ns, "Job", "tp8-job")]
    assert events.GANG_OWNER_FAILED in job_events
    print(f"member {victim} failed -> gang {st['phase']}: {st['message']}")


@pytest.mark.parametrize("applied", ["gang-jobset"], indirect=True)
def test_jobset_tp8_gang_in_one_domain_released_when_a_member_fails(
    gpu_cluster: GpuCluster, workload_controllers: dict[str, addons.Addon], applied: str
) -> None:
    ns, gang = "gpuplane-ex-gang-jobset", "tp8-jobset"
    wait_phase(gpu_cluster, ns, gang, "Running")
    pods = gpu_cluster.running_pods(ns, 2)
    print("\n" + "\n".join(assert_one_domain_gang(gpu_cluster, ns, gang, pods)))
    placed = gang_status(gpu_cluster, ns, gang)["placement"]["members"]
    for pod in pods:
        index = pod["metadata"]["labels"]["jobset.sigs.k8s.io/job-global-index"]  # one pod per Job
        assert placed[index] == pod["spec"]["nodeName"]
    victim = sorted(p["metadata"]["name"] for p in pods)[1]
    fail_pod(gpu_cluster, ns, victim)
    st = assert_released(gpu_cluster, ns, gang, events.GANG_OWNER_FAILED)
    reasons = [e["reason"] for e in events_on(gpu_cluster, ns, "JobSet", "tp8-jobset")]
    assert events.GANG_OWNER_FAILED in reasons
    print(f"member {victim} failed -> gang {st['phase']}: {st['message']}")


@pytest.mark.parametrize("applied", ["gang-indexed-job"], indirect=True)
def test_suspended_job_releases_the_gang_and_a_replaced_member_rejoins(gpu_cluster: GpuCluster, applied: str) -> None:
    ns, gang, handle = "gpuplane-ex-gang-indexed-job", "tp8-job", gpu_cluster.cluster
    first = wait_phase(gpu_cluster, ns, gang, "Running")
    handle.kubectl("patch", "job", "-n", ns, gang, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    st = assert_released(gpu_cluster, ns, gang, events.GANG_OWNER_SUSPENDED)
    print(f"suspended -> {st['phase']}: {st['message']}")
    handle.kubectl(
        "patch", "job", "-n", ns, gang, "--type=merge", "-p", '{"spec": {"suspend": false, "backoffLimit": 3}}'
    )
    again = wait_phase(gpu_cluster, ns, gang, "Running")
    assert again["domain"] == first["domain"]
    pods = gpu_cluster.running_pods(ns, 2)
    # A member deleted while the Job still retries: the Job replaces it, the gang keeps its decision and
    # the replacement (gated, from the template) is narrowed to the same node and ungated.
    decision = again["placement"]["id"]
    gone = sorted(pods, key=lambda p: p["metadata"]["name"])[1]
    index = gone["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
    handle.kubectl("delete", "pod", "-n", ns, gone["metadata"]["name"], "--wait=false")

    def rejoined() -> list[dict[str, Any]] | None:
        now = [p for p in gpu_cluster.pods(ns) if p["status"].get("phase") == "Running"]
        names_ = {p["metadata"]["name"] for p in now}
        return now if len(now) == 2 and gone["metadata"]["name"] not in names_ else None

    now = eventually(rejoined, 120, "the replacement member running")
    st = wait_phase(gpu_cluster, ns, gang, "Running")
    assert st["placement"]["id"] == decision
    (replacement,) = [p for p in now if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == index]
    assert replacement["spec"]["nodeName"] == gone["spec"]["nodeName"]
    print(f"member {index} deleted -> {replacement['metadata']['name']} rejoined on {replacement['spec']['nodeName']}")


LWS_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


@pytest.mark.parametrize("applied", ["gang-leaderworkerset"], indirect=True)
def test_leaderworkerset_tp8_gang_in_one_domain_rejoins_its_recreated_group_and_is_released_with_it(
    gpu_cluster: GpuCluster, workload_controllers: dict[str, addons.Addon], applied: str
) -> None:
    ns, gang, handle = "gpuplane-ex-gang-leaderworkerset", "tp8-lws", gpu_cluster.cluster
    first = wait_phase(gpu_cluster, ns, gang, "Running", 180)
    pods = gpu_cluster.running_pods(ns, 2)
    print("\n" + "\n".join(assert_one_domain_gang(gpu_cluster, ns, gang, pods)))
    placed = first["placement"]["members"]
    by_index = {p["metadata"]["labels"][LWS_INDEX]: p for p in pods}
    assert sorted(by_index) == ["0", "1"], "a leader (worker-index 0) and one worker"
    for index, pod in by_index.items():
        assert placed[index] == pod["spec"]["nodeName"]  # member index = worker index
    print(
        f"leader {by_index['0']['metadata']['name']} = member 0, worker {by_index['1']['metadata']['name']} = member 1"
    )
    # A deleted worker: LWS (RecreateGroupOnPodRestart) deletes the leader and makes the whole group again,
    # gated from its templates; the gang keeps its decision and narrows the new pods to the same trays.
    # The worker is held terminating until LWS has acted, as a real one is for its grace period: LWS v0.9.0
    # misses a worker that is gone and replaced before it reconciles (gangkit.held_deletion, lws#998).
    old = {p["metadata"]["uid"] for p in pods}
    leader = by_index["0"]["metadata"]
    began = time.monotonic()

    def explain() -> str:
        return gangkit.namespace_report(gpu_cluster, ns, gang)

    def leader_going() -> bool:
        try:
            now = gpu_cluster.pod(ns, leader["name"])["metadata"]
        except KubectlError:
            return True  # gone already
        return now["uid"] != leader["uid"] or bool(now.get("deletionTimestamp"))

    with gangkit.held_deletion(gpu_cluster, ns, by_index["1"]) as release:
        gangkit.eventually_explained(
            leader_going, 90, "LWS to delete the leader of the group whose worker is deleted", report=explain
        )
        release()
    told = time.monotonic() - began

    def recreated() -> list[dict[str, Any]] | None:
        now = [p for p in gpu_cluster.pods(ns) if p["status"].get("phase") == "Running"]
        return now if len(now) == 2 and not {p["metadata"]["uid"] for p in now} & old else None

    again = gangkit.eventually_explained(
        recreated, 180, "the recreated group (new leader and worker) running", report=explain
    )
    print(
        f"worker deleted -> LWS deleted the leader after {told:.1f}s, new group running after "
        f"{time.monotonic() - began:.1f}s"
    )
    st = wait_phase(gpu_cluster, ns, gang, "Running")
    assert st["placement"]["id"] == first["placement"]["id"] and st["domain"] == first["domain"]
    for pod in again:
        assert pod["spec"]["nodeName"] == placed[pod["metadata"]["labels"][LWS_INDEX]]
    print("\n".join(assert_one_domain_gang(gpu_cluster, ns, gang, again)))
    print(f"worker deleted -> group recreated, gang {st['phase']} with the same decision {st['placement']['id']}")
    # Deleting the LWS releases the gang (foreground: the LWS is being deleted while its pods go).
    handle.kubectl("delete", "leaderworkerset", "-n", ns, gang, "--cascade=foreground", "--wait=false")
    gone = wait_phase(gpu_cluster, ns, gang, "Released", 120)
    assert gone["reason"] in ("OwnerDeleted", "MembersGone"), gone
    assert not gone.get("placement")
    eventually(lambda: not gpu_cluster.kubectl_json("get", "resourceclaims", "-n", ns)["items"], 60, "every claim gone")
    eventually(lambda: not gpu_cluster.pods(ns), 90, "every pod gone")
    eventually(gpu_cluster.nodes_are_clean, 60, "nodes clean: every GPU of the gang unprepared")
    print(f"LeaderWorkerSet deleted -> gang {gone['phase']} ({gone['reason']}): {gone['message']}")


def never_fits(ns: str, **gang: Any) -> str:
    """The Indexed Job example in namespace ``ns``, grown to 3 members of 4 GB200 GPUs: the rack has 8."""
    docs = list(yaml.safe_load_all((EXAMPLES / "gang-indexed-job" / "gang-indexed-job.yaml").read_text()))
    for doc in docs:
        doc["metadata"]["namespace"] = ns
        if doc["kind"] == "Namespace":
            doc["metadata"] = {"name": ns}
        elif doc["kind"] == "GpuGang":
            doc["spec"].update(members=3, tensorParallelSize=12, **gang)  # 12 GB200 GPUs in one domain
        elif doc["kind"] == "Job":
            doc["spec"].update(completions=3, parallelism=3)
    return yaml.safe_dump_all(docs)


def test_a_gang_that_can_never_fit_is_refused_on_the_gang_and_its_job(gpu_cluster: GpuCluster) -> None:
    ns = "gang-never-fits"
    handle = gpu_cluster.cluster
    handle.kubectl("apply", "-f", "-", input_text=never_fits(ns))
    try:
        st = wait_phase(gpu_cluster, ns, "tp8-job", "Unschedulable", 60)
        assert "12" in st["message"] or "NVLink" in st["message"], st
        refused = eventually(
            lambda: [e for e in events_on(gpu_cluster, ns, "Job", "tp8-job") if e["reason"] == events.GANG_REFUSED],
            30,
            "a GangRefused Event on the Job",
        )
        assert refused[0]["type"] == "Warning" and st["message"] in refused[0]["message"]
        time.sleep(2)
        assert all(not p["spec"].get("nodeName") for p in gpu_cluster.pods(ns)), "no member may start"
        print(f"refused: {st['message']}\nEvent on Job: {refused[0]['message']}")
    finally:
        handle.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)


def test_a_template_gang_that_times_out_suspends_its_job_and_leaves_nothing_gated(gpu_cluster: GpuCluster) -> None:
    """Not scheduled within timeoutSeconds: the gang is TimedOut with the reason, its Job is suspended (so it
    stops making pods gated for a gang that will never place them), and the Job carries a GangTimedOut Event."""
    ns, gang, handle = "gang-times-out", "tp8-job", gpu_cluster.cluster
    handle.kubectl("apply", "-f", "-", input_text=never_fits(ns, timeoutSeconds=20))
    try:
        st = wait_phase(gpu_cluster, ns, gang, "TimedOut", 120)
        assert "not scheduled within 20s" in st["message"] and "Job tp8-job suspended" in st["message"], st
        assert '"suspend":false' in st["message"], "the message says how to resume"
        job = eventually(
            lambda: (j := gpu_cluster.kubectl_json("get", "job", "-n", ns, gang))["spec"].get("suspend") and j,
            60,
            "the Job suspended",
        )
        told = eventually(
            lambda: [e for e in events_on(gpu_cluster, ns, "Job", gang) if e["reason"] == events.GANG_OWNER_TIMED_OUT],
            30,
            "a GangTimedOut Event on the Job",
        )
        assert told[0]["type"] == "Warning" and "not scheduled within 20s" in told[0]["message"]
        eventually(lambda: not gpu_cluster.pods(ns), 90, "every member pod gone, none made again")
        time.sleep(5)
        assert not gpu_cluster.pods(ns), "a suspended Job makes no pod that would wait gated"
        assert gang_status(gpu_cluster, ns, gang)["phase"] == "TimedOut"
        conditions = {c["type"]: c["status"] for c in (job.get("status") or {}).get("conditions") or []}
        print(f"timed out: {st['message']}\nEvent on Job: {told[0]['message']}\nJob conditions: {conditions}")
    finally:
        handle.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", timeout=150)
