"""JobSet and LeaderWorkerSet, built from their Go modules, work on the loopback control plane.

Each manager runs under its release's own ClusterRole, behind its release's
webhook configurations (pointed at loopback with the cluster CA's bundle): a
JobSet makes its Jobs and labelled pods, a bad JobSet is refused by its
validating webhook, a LeaderWorkerSet makes a leader and its workers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pytest
import yaml

from e2e.cluster import addons
from e2e.cluster import handle as cluster
from tests.e2e.conftest import eventually

pytestmark = pytest.mark.e2e


def _pods(handle: cluster.Cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    data = json.loads(handle.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json"))
    return cast(list[dict[str, Any]], data["items"])


def _jobset(ns: str, name: str, replicas: int) -> dict[str, Any]:
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "w",
                    "replicas": replicas,
                    "template": {"spec": {"parallelism": 1, "completions": 1, "template": {"spec": pod}}},
                }
            ]
        },
    }


@pytest.fixture
def namespace(control_plane: cluster.Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    ns = "addons-" + request.node.name.removeprefix("test_").split("_")[0]
    control_plane.kubectl("create", "namespace", ns)
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false")


def test_jobset_makes_jobs_and_labelled_pods_through_its_webhooks(
    control_plane: cluster.Cluster, workload_controllers: dict[str, addons.Addon], namespace: str
) -> None:
    hooks = control_plane.kubectl(
        "get", "mutatingwebhookconfigurations", "-l", "app.kubernetes.io/name=jobset", "-o", "json"
    )
    (config,) = json.loads(hooks)["items"]
    assert all(h["clientConfig"]["url"].startswith("https://127.0.0.1:") for h in config["webhooks"])
    control_plane.apply(_jobset(namespace, "smoke", 2))
    pods = eventually(
        lambda: (p := _pods(control_plane, namespace, "jobset.sigs.k8s.io/jobset-name=smoke")) and len(p) == 2 and p,
        60,
        "2 JobSet pods",
    )
    indices = sorted(p["metadata"]["labels"]["jobset.sigs.k8s.io/job-global-index"] for p in pods)
    assert indices == ["0", "1"]
    jobs = json.loads(control_plane.kubectl("get", "jobs", "-n", namespace, "-o", "json"))["items"]
    assert sorted(j["metadata"]["name"] for j in jobs) == ["smoke-w-0", "smoke-w-1"]
    # The validating webhook answers (the CRD schema cannot check this): a success policy naming no replicatedJob.
    bad = _jobset(namespace, "bad", 1)
    bad["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["nope"]}
    with pytest.raises(cluster.KubectlError, match=r"invalid replicatedJob name 'nope' does not appear"):
        control_plane.kubectl("create", "-f", "-", input_text=yaml.safe_dump(bad))


def test_leaderworkerset_makes_a_leader_and_its_workers(
    control_plane: cluster.Cluster, workload_controllers: dict[str, addons.Addon], namespace: str
) -> None:
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "smoke", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "workerTemplate": {"spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}},
            },
        },
    }
    control_plane.apply(lws)
    selector = "leaderworkerset.sigs.k8s.io/name=smoke"
    pods = eventually(
        lambda: (p := _pods(control_plane, namespace, selector)) and len(p) == 2 and p, 60, "leader and worker pods"
    )
    workers = sorted(p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] for p in pods)
    assert workers == ["0", "1"]
