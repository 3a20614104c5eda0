"""IMEX groups (issue 35): hand-placed pods without a gang get an IMEX domain through a claim label.

On the session's two ``gb200-nvl72`` trays (one clique, daemons run as the drivers' children with the stand-ins
of ``tests/fakes``): group ``alpha`` in a test namespace is two pods pinned with ``nodeSelector`` to the two
trays, each with a claim from a ``ResourceClaimTemplate`` whose ``spec.metadata.labels`` carry
``gpuplane.dev/imex-group: alpha``; group ``train`` is ``manifests/examples/imex-group`` applied as its README
says (its own namespace, anti-affinity across the trays). The leader writes one ``ImexDomain`` (the groups share
both trays) listing each group with its own channel; each claim's CDI spec on its tray carries its group's
channel node and environment, no other; both trays report ready. A labelled claim with a name that is not a DNS
label gets a Warning ``ImexGroupInvalid`` and no group. Deleting the pods leaves no ``ImexDomain``, no CDI spec,
no prepared claim.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from e2e.plane.imex_gangs import CHANNELS, GB200
from gpuplane.api import imex_group
from tests.e2e.conftest import GpuCluster, eventually
from tests.e2e.test_imex import cdi_imex, domains
from tests.hostilekit import apply_text, events_of, ns_fixture  # noqa: F401  (fixture ns)

pytestmark = pytest.mark.e2e

EXAMPLE_NS = "gpuplane-ex-imex-group"


def group_objects(ns: str, group: str, trays: list[str]) -> str:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{group}-gpu", "namespace": ns},
        "spec": {
            "metadata": {"labels": {imex_group.LABEL: group}},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.gpuplane.dev",
                                "selectors": [{"cel": {"expression": GB200}}],
                            },
                        }
                    ]
                }
            },
        },
    }
    items: list[dict[str, Any]] = [template]
    for i, tray in enumerate(trays):
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{group}-{i}", "namespace": ns},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": tray},
                    "resourceClaims": [{"name": "g", "resourceClaimTemplateName": f"{group}-gpu"}],
                    "containers": [
                        {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "g"}]}}
                    ],
                },
            }
        )
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def pod_claims(gc: GpuCluster, ns: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Pod name -> (its node, its one generated claim), for the namespace's Running pods."""
    out = {}
    for pod in gc.pods(ns):
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        (status,) = pod["status"].get("resourceClaimStatuses") or []
        out[pod["metadata"]["name"]] = (pod["spec"]["nodeName"], gc.claim(ns, status["resourceClaimName"]))
    return out


def test_hand_placed_groups_get_their_own_channels_and_nothing_is_left(gpu_cluster: GpuCluster, ns: str) -> None:
    gc = gpu_cluster
    trays = sorted(n.name for n in gc.of_profile("gb200-nvl72"))
    assert len(trays) == 2, trays
    assert domains(gc) == [], "an ImexDomain before any group"

    start = time.monotonic()
    apply_text(gc, group_objects(ns, "alpha", trays))
    gc.apply_example("imex-group")
    try:
        alpha = eventually(lambda: (p := pod_claims(gc, ns)) and len(p) == 2 and p, 180, "alpha's pods Running")
        train = eventually(
            lambda: (p := pod_claims(gc, EXAMPLE_NS)) and len(p) == 2 and p, 180, "the example's pods Running"
        )
        print(f"\n[e2e] both groups' four pods Running {time.monotonic() - start:.1f}s after apply")

        (obj,) = domains(gc)
        entries = {(g["namespace"], g["name"]): g for g in obj["spec"]["gangs"]}
        assert sorted(entries) == [(EXAMPLE_NS, "train"), (ns, "alpha")], sorted(entries)
        assert obj["spec"]["nodes"] == trays
        channel = {k: g["channel"] for k, g in entries.items()}
        print(f"[e2e] ImexDomain {obj['metadata']['name']} on {trays}: channels {channel}")
        assert all(c >= 1 for c in channel.values()) and len(set(channel.values())) == 2, channel
        for key, g in entries.items():
            assert g["uid"] == imex_group.group_uid(*key)
        status = {e["node"]: e["ready"] for e in obj.get("status", {}).get("nodes", [])}
        assert status == dict.fromkeys(trays, True), status

        for group_ns, group, pods in ((ns, "alpha", alpha), (EXAMPLE_NS, "train", train)):
            nodes = set()
            for pod, (node, claim) in sorted(pods.items()):
                uid = claim["metadata"]["uid"]
                listed = [(c["uid"], c["node"]) for c in entries[(group_ns, group)]["claims"]]
                assert (uid, node) in listed, (pod, listed)
                paths, env = cdi_imex(gc, node, uid)
                print(f"[e2e] {group_ns}/{pod} ({group}) on {node}: CDI {paths} {env}")
                ch = channel[(group_ns, group)]
                assert paths == [f"{CHANNELS}{ch}"], (pod, paths)
                assert env == [f"GPUPLANE_IMEX_CHANNEL={ch}", f"GPUPLANE_IMEX_DOMAIN={obj['metadata']['name']}"]
                nodes.add(node)
            assert nodes == set(trays), (group, nodes)

        bad = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "badly-named", "namespace": ns, "labels": {imex_group.LABEL: "Not_A_Name"}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}},
        }
        apply_text(gc, json.dumps(bad))
        said = eventually(
            lambda: [e["message"] for e in events_of(gc, ns, "badly-named") if e["reason"] == "ImexGroupInvalid"],
            60,
            "a Warning ImexGroupInvalid on the badly labelled claim",
        )
        print(f"[e2e] badly-named: {said[0]}")
        assert "'Not_A_Name' is not a DNS label" in said[0]
        assert len(domains(gc)) == 1
    finally:
        gc.cluster.kubectl(
            "delete", "pods,resourceclaims,resourceclaimtemplates", "--all", "-n", ns, "--wait=true", timeout=120
        )
        gc.delete_example("imex-group")
    eventually(lambda: domains(gc) == [], 60, "the ImexDomain deleted with the groups' claims")
    eventually(gc.nodes_are_clean, 60, "no prepared claim or CDI spec left on any node")
