"""IMEX for gangs on real nodes (issue 35, Must show 1 and 3): channels inside real containers, daemons in pods.

The session's two real ``gb200-nvl72`` nodes (one NVL72 clique, 4 GPUs each; ``realfixtures.REAL_NODES``) run the
driver as the DaemonSet's pod with ``--imex-daemons=pod`` and the image's stand-in ``nvidia-imex``
(``manifests/overlays/local``). Two gangs at once, each an Indexed Job with busybox ranks: ``wide`` (2 members x
3 GPUs: no tray holds 6, so it spans both) and then ``narrow`` (2 x 1: the one GPU left on each tray). Two TP=8
gangs (2 x 4 each) cannot be there at once: 16 GPUs on 8; one TP=8 gang runs afterwards on its own.

Shown: the controller's ``ImexDomain`` lists both trays and both gangs with distinct channels; on each tray the
driver runs one IMEX daemon pod whose node file lists exactly the trays' InternalIPs (in node-name order) and
whose stand-in reports its peers connected and ready; each rank's container sees exactly its own gang's channel
device (``stat`` inside the container: major of the simulated ``/proc/devices``, minor = the channel), the same
in every member, another in the other gang; the time from each gang's ``placedAt`` to all members Running.
Then the driver pods are deleted: the daemon pods stay (same uid), the ranks keep running, the domain stays
ready, and the new drivers adopt the pods. Deleting the Jobs and gangs leaves nothing: no ``ImexDomain``, no
daemon pod, no daemon directory, no CDI spec or checkpoint entry.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.realnode import images
from e2e.plane.realnode.plan import RealNode
from gpuplane.driver.hw import caps
from gpuplane.driver.sharing import imex_pods
from tests.e2e.conftest import eventually
from tests.e2e.realfixtures import RealCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NS = "gpuplane-imex-real"
SYSTEM = "gpuplane-system"
GB200 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"'
CHANNELS = "/dev/nvidia-caps-imex-channels"
PROBE = f'for f in {CHANNELS}/*; do [ -c "$f" ] && stat -c "CHANNEL %n %t:%T" "$f"; done; true'
SHELL = f"{PROBE}; env | grep GPUPLANE_IMEX; trap 'exit 0' TERM; while true; do sleep 1; done"
DAEMONS = f"app.kubernetes.io/component={imex_pods.COMPONENT}"


def gang_objects(name: str, members: int, gpus: int) -> list[dict[str, Any]]:
    """A GpuGang, its ResourceClaimTemplate and its Indexed Job of busybox ranks."""
    gang = {
        "apiVersion": "gpuplane.dev/v1alpha1",
        "kind": "GpuGang",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"members": members, "gpusPerMember": gpus, "selectors": [GB200]},
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{name}-gpus", "namespace": NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": "gpu.gpuplane.dev",
                                "allocationMode": "ExactCount",
                                "count": gpus,
                                "selectors": [{"cel": {"expression": GB200}}],
                            },
                        }
                    ],
                    "constraints": [{"requests": ["gpus"], "matchAttribute": "gpu.gpuplane.dev/nvlinkDomain"}],
                }
            }
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "completionMode": "Indexed",
            "completions": members,
            "parallelism": members,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"gpuplane.dev/gang": name}},
                "spec": {
                    "schedulingGates": [{"name": "gpuplane.dev/gang"}],
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 2,
                    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": f"{name}-gpus"}],
                    "containers": [
                        {
                            "name": "rank",
                            "image": images.BUSYBOX_IMAGE,
                            "command": ["sh", "-c", SHELL],
                            "resources": {"claims": [{"name": "gpus"}]},
                        }
                    ],
                },
            },
        },
    }
    return [gang, template, job]


def apply(real: RealCluster, objects: list[dict[str, Any]]) -> None:
    real.gpu.cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def ranks(real: RealCluster, gang: str) -> list[dict[str, Any]]:
    pods = real.kubectl_json("get", "pods", "-n", NS, "-l", f"job-name={gang}").get("items", [])
    return sorted(pods, key=lambda p: p["metadata"]["name"])


def all_running(real: RealCluster, gang: str, members: int) -> bool:
    pods = ranks(real, gang)
    return len(pods) == members and all(p["status"].get("phase") == "Running" for p in pods)


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def placed_to_running(real: RealCluster, gang: str) -> float:
    """Seconds from the gang's ``placedAt`` to its last member's container start."""
    placed = real.kubectl_json("get", "gpugang", "-n", NS, gang)["status"]["placedAt"]
    started = [
        stamp(cs["state"]["running"]["startedAt"]) for p in ranks(real, gang) for cs in p["status"]["containerStatuses"]
    ]
    return max(started) - stamp(placed)


def domains(real: RealCluster) -> list[dict[str, Any]]:
    return list(real.kubectl_json("get", "imexdomains", "-n", SYSTEM).get("items", []))


def daemon_pods(real: RealCluster) -> list[dict[str, Any]]:
    return list(real.kubectl_json("get", "pods", "-n", SYSTEM, "-l", DAEMONS).get("items", []))


def imex_dir(node: RealNode) -> Path:
    return node.plugin_dir / "imex"


def daemon_record(node: RealNode) -> dict[str, Any]:
    """What the stand-in daemon in the node's pod says of itself (pid, peers connected, ready, reloads)."""
    record: dict[str, Any] = json.loads((imex_dir(node) / "standin-record.json").read_text())
    return record


def domain_ready(obj: dict[str, Any], trays: list[str]) -> bool:
    entries = {e["node"]: e for e in (obj.get("status") or {}).get("nodes") or []}
    generation = obj["metadata"]["generation"]
    return all(
        entries.get(t, {}).get("ready") is True and entries[t].get("observedGeneration") == generation for t in trays
    )


def seen_channels(real: RealCluster, pod: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(path, major, minor) of every channel device inside the rank's container (``stat`` run there)."""
    out = real.exec(NS, pod["metadata"]["name"], "sh", "-c", PROBE)
    found = []
    for line in out.splitlines():
        if line.startswith("CHANNEL "):
            _, path, numbers = line.split()
            major, minor = numbers.split(":")
            found.append((path, int(major, 16), int(minor, 16)))
    return found


def diagnose(real: RealCluster) -> None:
    """What a stuck gang's objects say: gangs, ranks, events, the domain's status, the daemon pods and their logs."""
    for args in (
        ("get", "gpugangs,pods", "-n", NS, "-o", "wide"),
        ("get", "events", "-n", NS, "--sort-by=.lastTimestamp"),
        ("get", "imexdomains", "-n", SYSTEM, "-o", "yaml"),
        ("get", "pods", "-n", SYSTEM, "-o", "wide"),
        ("logs", "-n", SYSTEM, "-l", DAEMONS, "--tail=30", "--prefix"),
        ("logs", "-n", SYSTEM, "-l", "app.kubernetes.io/name=gpuplane-driver", "--tail=400", "--prefix"),
    ):
        out = real.kubectl(*args, check=False, timeout=60)
        if args[0] == "logs" and "driver" in args[-3]:
            out = "\n".join(line for line in out.splitlines() if "imex" in line.lower())
        print(f"[diagnose] $ kubectl {' '.join(args)}\n{out}")


def wait_running(real: RealCluster, gang: str, members: int) -> None:
    try:
        eventually(lambda: all_running(real, gang, members), 300, f"gang {gang}'s ranks Running")
    except AssertionError:
        diagnose(real)
        raise


@pytest.fixture
def namespace(only_real_nodes: RealCluster) -> Iterator[RealCluster]:
    only_real_nodes.kubectl("create", "namespace", NS)
    try:
        yield only_real_nodes
    finally:
        only_real_nodes.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s", check=False, timeout=150)


def test_two_gangs_across_two_real_trays_see_their_own_channels_through_daemon_pods(namespace: RealCluster) -> None:
    real = namespace
    trays = sorted(real.of_profile("gb200-nvl72"), key=lambda n: n.name)
    names = [t.name for t in trays]
    assert len(trays) == 2, names
    assert domains(real) == [] and daemon_pods(real) == [], "IMEX objects before any gang"

    began = time.monotonic()
    apply(real, gang_objects("wide", 2, 3))
    wait_running(real, "wide", 2)
    apply(real, gang_objects("narrow", 2, 1))
    wait_running(real, "narrow", 2)
    print(f"\n[e2e] both gangs Running {time.monotonic() - began:.1f}s after the first apply")
    for gang in ("wide", "narrow"):
        print(f"[e2e] gang {gang}: placedAt -> all members Running: {placed_to_running(real, gang):.1f}s")

    (obj,) = domains(real)
    assert obj["spec"]["nodes"] == names
    channel = {g["name"]: g["channel"] for g in obj["spec"]["gangs"]}
    assert set(channel) == {"wide", "narrow"} and min(channel.values()) >= 1, channel
    assert channel["wide"] != channel["narrow"], channel
    assert domain_ready(obj, names), obj.get("status")
    print(f"[e2e] ImexDomain {obj['metadata']['name']} on {names}: channels {channel}, status {obj['status']}")

    # the daemons: one pod per tray, its node file exactly the trays' InternalIPs, peers connected
    pods = {p["spec"]["nodeName"]: p for p in daemon_pods(real)}
    assert sorted(pods) == names, sorted(pods)
    expected = "".join(f"{t.node_ip}\n" for t in trays)
    for tray in trays:
        pod = pods[tray.name]
        assert pod["metadata"]["name"] == imex_pods.pod_name(tray.name, obj["metadata"]["name"])
        assert pod["status"]["phase"] == "Running", pod["status"]
        node_file = (imex_dir(tray) / "nodes.cfg").read_text()
        assert node_file == expected, (tray.name, node_file)
        config = (imex_dir(tray) / "config.cfg").read_text()
        assert f"BIND_INTERFACE_IP={tray.node_ip}\n" in config, config
        record = daemon_record(tray)
        print(f"[e2e] {tray.name} daemon pod {pod['metadata']['name']}: node file {node_file.split()}, {record}")
        assert record["ready"] is True, record
    uids = {n: p["metadata"]["uid"] for n, p in pods.items()}
    pids = {t.name: daemon_record(t)["pid"] for t in trays}

    # inside each container: exactly its own gang's channel, same major everywhere, minor = the channel
    majors = set()
    for gang in ("wide", "narrow"):
        seen_nodes = set()
        for pod in ranks(real, gang):
            seen = seen_channels(real, pod)
            print(f"[e2e] {gang} {pod['metadata']['name']} on {pod['spec']['nodeName']}: {seen}")
            ((path, major, minor),) = seen
            assert (path, minor) == (f"{CHANNELS}/channel{channel[gang]}", channel[gang]), seen
            majors.add(major)
            seen_nodes.add(pod["spec"]["nodeName"])
        assert seen_nodes == set(names), f"gang {gang} is on {seen_nodes}, not across both trays"
    # the major of the node's /proc/devices (the simulator's, as the driver reads the kernel's on a real host)
    kernel = {caps.imex_channel_major((t.sim_state_dir / "proc" / "devices").read_text()) for t in trays}
    assert majors == kernel and len(majors) == 1, (majors, kernel)
    print(f"[e2e] every rank sees major {majors.pop()} (the nodes' /proc/devices); minors = channels {channel}")

    # the driver pods deleted mid-run: the daemon pods stay, the ranks keep running, the domain stays ready
    drivers = real.kubectl_json("get", "pods", "-n", SYSTEM, "-l", "app.kubernetes.io/name=gpuplane-driver")["items"]
    old = {p["metadata"]["uid"] for p in drivers}
    restarted = time.monotonic()
    real.kubectl("delete", "pods", "-n", SYSTEM, "-l", "app.kubernetes.io/name=gpuplane-driver", "--wait=true")
    real.kubectl("rollout", "status", "-n", SYSTEM, "daemonset/gpuplane-driver", "--timeout=240s", timeout=270)

    def new_drivers_ready() -> bool:
        now = real.kubectl_json("get", "pods", "-n", SYSTEM, "-l", "app.kubernetes.io/name=gpuplane-driver")
        fresh = [p for p in now["items"] if p["metadata"]["uid"] not in old]
        return len(fresh) == len(drivers) and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
            for p in fresh
        )

    eventually(new_drivers_ready, 240, "the new driver pods Ready")
    print(f"[e2e] driver pods replaced and Ready in {time.monotonic() - restarted:.1f}s")
    time.sleep(5)  # several ticks of the new drivers: an adoption that failed would have deleted the pods by now
    after = {p["spec"]["nodeName"]: p for p in daemon_pods(real)}
    assert {n: p["metadata"]["uid"] for n, p in after.items()} == uids, "daemon pods replaced by the new drivers"
    assert all(p["status"]["phase"] == "Running" for p in after.values())
    assert all(cs.get("restartCount", 0) == 0 for p in after.values() for cs in p["status"]["containerStatuses"])
    assert {t.name: daemon_record(t)["pid"] for t in trays} == pids, "a daemon restarted with the driver"
    for gang, members in (("wide", 2), ("narrow", 2)):
        assert all_running(real, gang, members), f"gang {gang} stopped with the drivers"
        assert all(cs.get("restartCount", 0) == 0 for p in ranks(real, gang) for cs in p["status"]["containerStatuses"])
    (obj,) = domains(real)
    assert domain_ready(obj, names), obj.get("status")
    print(
        f"[e2e] after the driver restart: same daemon pods {sorted(uids.values())} and daemons (pids {pids}), "
        "ranks Running, domain ready"
    )

    teardown(real, trays, ("narrow", "wide"))


def test_one_tp8_gang_of_two_full_trays(namespace: RealCluster) -> None:
    """Afterwards, one TP=8 gang (2 x 4: both trays whole): one channel for both ranks, the daemons again."""
    real = namespace
    trays = sorted(real.of_profile("gb200-nvl72"), key=lambda n: n.name)
    assert domains(real) == [] and daemon_pods(real) == [], "IMEX objects left by the test before"
    apply(real, gang_objects("tp8", 2, 4))
    wait_running(real, "tp8", 2)
    print(f"\n[e2e] gang tp8 (2 x 4): placedAt -> all members Running: {placed_to_running(real, 'tp8'):.1f}s")
    (obj,) = domains(real)
    ((gang,),) = [obj["spec"]["gangs"]]
    assert gang["name"] == "tp8" and gang["channel"] >= 1 and domain_ready(obj, [t.name for t in trays])
    seen = {p["spec"]["nodeName"]: seen_channels(real, p) for p in ranks(real, "tp8")}
    print(f"[e2e] tp8 ranks see {seen}")
    assert sorted(seen) == [t.name for t in trays]
    assert all(s == [(f"{CHANNELS}/channel{gang['channel']}", s[0][1], gang["channel"])] for s in seen.values()), seen
    teardown(real, trays, ("tp8",))


def teardown(real: RealCluster, trays: list[RealNode], gangs: tuple[str, ...]) -> None:
    """Delete the Jobs and gangs; nothing of IMEX (domain, pods, files) or of the claims is left."""
    gone = time.monotonic()
    for gang in gangs:
        real.kubectl("delete", "job", "-n", NS, gang, "--cascade=foreground", "--wait=true", timeout=120)
        real.kubectl("delete", "gpugang", "-n", NS, gang, "--wait=true", timeout=120)
    eventually(lambda: domains(real) == [], 90, "the ImexDomain deleted with its gangs")
    eventually(lambda: daemon_pods(real) == [], 90, "the IMEX daemon pods deleted")
    eventually(lambda: not any(imex_dir(t).exists() for t in trays), 60, "the daemons' directories removed")
    real.wait_clean()
    for tray in trays:
        claims = real.checkpoint(tray).claims
        assert claims == {}, claims
    print(f"[e2e] teardown: nothing left {time.monotonic() - gone:.1f}s after the deletes")
