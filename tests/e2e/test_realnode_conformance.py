"""Behaviour 6: the kubelet stand-in (``e2e/plane/kubelet.py``) calls the driver exactly as the real kubelet does.

The stand-in stays for scale (many simulated nodes on two cores), so it must not
drift from kubelet. One scenario runs on a simulated ``hgx-h100`` node (stand-in)
and on the real ``hgx-h100`` node (kubelet v1.36), and the calls each node's
driver received (``kubelet call`` lines, ``gpuplane.driver.plugin.call_log``) are compared:
registration (GetInfo, the dra-health stream, NotifyRegistrationStatus), then
every NodePrepareResources / NodeUnprepareResources with the fields of each
claim in it, in order. The scenario: a pod with a shared claim and a claim from a
template (both in one prepare call), a second pod on the shared claim (already
prepared: no call), the first pod deleted (only its template claim is
unprepared), the second deleted (the shared claim is unprepared).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from e2e.cluster.realnode import images
from tests.e2e import realchecks
from tests.e2e.conftest import eventually
from tests.e2e.realfixtures import RealCluster

pytestmark = pytest.mark.e2e
# The driver as a host process on purpose: the test compares every call the real kubelet made since the
# driver started with the stand-in's, from the driver's call log in the state dir, as the stand-in's driver
# writes it (both drivers the same program, so the difference is the caller's alone).
HOST_DRIVER = True

MIG_1G = 'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"'
REGISTRATION = ("GetInfo", "NodeWatchResources", "NotifyRegistrationStatus")
DRA = ("NodePrepareResources", "NodeUnprepareResources")


def scenario_objects(namespace: str, node: str) -> list[dict[str, Any]]:
    def pod(name: str, claims: dict[str, dict[str, str]]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": entry, **source} for entry, source in claims.items()],
                "containers": [
                    {
                        "name": "c",
                        "image": images.PAUSE_IMAGE,
                        "resources": {"claims": [{"name": entry} for entry in claims]},
                    }
                ],
            },
        }

    exactly = {"deviceClassName": "gpu.gpuplane.dev"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "slice", "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "mig",
                                "exactly": {
                                    "deviceClassName": "mig.gpuplane.dev",
                                    "selectors": [{"cel": {"expression": MIG_1G}}],
                                },
                            }
                        ]
                    }
                }
            },
        },
        pod("first", {"shared": {"resourceClaimName": "shared"}, "slice": {"resourceClaimTemplateName": "slice"}}),
    ]


def second_pod(namespace: str, node: str) -> dict[str, Any]:
    first = scenario_objects(namespace, node)[-1]
    spec = {**first["spec"], "resourceClaims": [{"name": "shared", "resourceClaimName": "shared"}]}
    spec["containers"] = [{**spec["containers"][0], "resources": {"claims": [{"name": "shared"}]}}]
    return {**first, "metadata": {"name": "second", "namespace": namespace}, "spec": spec}


def run_scenario(
    real: RealCluster, node: str, namespace: str, driver_log: Any
) -> tuple[list[realchecks.Call], dict[str, str]]:
    """The scenario on one node; returns the calls its driver received meanwhile, and claim name -> uid."""
    start = len(realchecks.kubelet_calls(driver_log))

    def apply(*objects: dict[str, Any]) -> None:
        real.gpu.cluster.apply("\n---\n".join(json.dumps(o) for o in objects))

    def running(name: str) -> None:
        def probe() -> bool:
            pod = real.kubectl_json("get", "pod", "-n", namespace, name)
            return pod["status"].get("phase") == "Running"

        eventually(probe, 120, f"{namespace}/{name} Running on {node}")

    def calls(method: str) -> int:
        return sum(1 for c in realchecks.kubelet_calls(driver_log)[start:] if c.method == method)

    apply(*scenario_objects(namespace, node))
    running("first")
    uids = {
        c["metadata"]["name"]: c["metadata"]["uid"]
        for c in real.gpu.kubectl_json("get", "resourceclaims", "-n", namespace)["items"]
    }
    apply(second_pod(namespace, node))
    running("second")
    time.sleep(2)  # room for a (wrong) second prepare call to show up
    real.kubectl("delete", "pod", "-n", namespace, "first", "--wait=true", timeout=120)
    eventually(lambda: calls("NodeUnprepareResources") >= 1, 60, f"unprepare on {node} after the first pod")
    time.sleep(1)
    real.kubectl("delete", "pod", "-n", namespace, "second", "--wait=true", timeout=120)
    eventually(lambda: calls("NodeUnprepareResources") >= 2, 60, f"unprepare on {node} after the second pod")
    time.sleep(2)
    real.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s", timeout=150)
    return [c for c in realchecks.kubelet_calls(driver_log)[start:] if c.method in DRA], uids


def normalized(
    calls: list[realchecks.Call], namespace: str, uids: dict[str, str]
) -> list[tuple[str, list[tuple[str, str, bool]]]]:
    """Each DRA call as (method, [(namespace, claim name, uid is the claim's)]), generated name suffixes removed."""
    out = []
    for call in calls:
        claims = []
        for ns, name, uid in sorted(call.claims()):
            generic = re.sub(r"-[a-z0-9]{5}$", "-*", name)
            claims.append(("NS" if ns == namespace else ns, generic, uids.get(name) == uid))
        extra = sorted(set(call.request) - {"claims"})
        out.append((call.method + (f" {extra}" if extra else ""), claims))
    return out


def registration(calls: list[realchecks.Call]) -> tuple[str, frozenset[str], dict[str, Any]]:
    """The first registration: GetInfo, then the health stream and NotifyRegistrationStatus (kubelet makes
    those two concurrently, so their order is not part of the contract), with Notify's request."""
    first = [c for c in calls if c.method in REGISTRATION][:3]
    notify = next(c.request for c in first if c.method == "NotifyRegistrationStatus")
    return first[0].method, frozenset(c.method for c in first[1:]), notify


def test_stand_in_calls_the_driver_as_kubelet_does(real_cluster: RealCluster) -> None:
    real = real_cluster
    sim_node = real.gpu.of_profile("hgx-h100")[0]
    (real_node,) = real.of_profile("hgx-h100")
    sim_log = real.gpu.sim.log(sim_node.driver_process)
    real_log = real.real.log(real_node.processes[0])

    sim_calls, sim_uids = run_scenario(real, sim_node.name, "conformance-standin", sim_log)
    real_calls, real_uids = run_scenario(real, real_node.name, "conformance-kubelet", real_log)
    expected_kubelet = normalized(real_calls, "conformance-kubelet", real_uids)
    got_standin = normalized(sim_calls, "conformance-standin", sim_uids)
    assert all(ok for _, claims in expected_kubelet for _, _, ok in claims), "kubelet sent a claim uid not the claim's"
    print("\nreal kubelet:", *expected_kubelet, sep="\n  ")
    print("stand-in:", *got_standin, sep="\n  ")
    assert got_standin == expected_kubelet

    kubelet_registration = registration(realchecks.kubelet_calls(real_log))
    standin_registration = registration(realchecks.kubelet_calls(sim_log))
    print("registration, real kubelet:", kubelet_registration, "\nregistration, stand-in:", standin_registration)
    assert standin_registration == kubelet_registration
    assert kubelet_registration == (
        "GetInfo",
        frozenset({"NodeWatchResources", "NotifyRegistrationStatus"}),
        {"plugin_registered": True, "error": ""},
    )
