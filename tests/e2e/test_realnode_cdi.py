"""Behaviour 2: inside real containers (``kubectl exec``), the env and device nodes match the allocation.

The examples' claims (whole GPU, two MIG devices, an MPS gold/bronze pair, a
claim shared by two containers, four NVLink GPUs) are applied with busybox in
place of pause, in namespaces of their own, on the real nodes only. In every
container ``env`` names the allocated GPU or MIG UUIDs; ``/dev`` holds exactly
the claim's NVIDIA nodes with a real driver's numbers; reading the claim's GPU
fails with ENXIO (the devices cgroup let it through, no driver behind it) while
a node the container makes itself for another GPU is refused (EPERM: nothing of
another claim); an MPS container sees its own daemon's pipe directory, whose
daemon runs with the tier's limits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.realnode import images
from gpuplane.driver.sharing.mps_spec import CONTAINER_PIPE_DIR, PID_FILE
from tests.e2e import realchecks
from tests.e2e.conftest import EXAMPLES
from tests.e2e.realfixtures import RealCluster

pytestmark = pytest.mark.e2e

CASES = {
    "whole-gpu": 2,  # pods
    "mig-two-profiles": 1,
    "mps-tiers": 2,
    "shared-claim": 2,  # the producer pod's two containers share the claim (and the consumer pod)
    "nvlink-4gpu": 1,
}
# The MPS client priority each tier class sets (manifests/deviceclasses/mps-*.yaml; NVIDIA: 0 normal, 1 below
# normal), written out rather than read from the checkpoint, so a driver that gave every tier 0 fails here.
TIER_PRIORITY = {"mps-gold.gpu.gpuplane.dev": 0, "mps-silver.gpu.gpuplane.dev": 0, "mps-bronze.gpu.gpuplane.dev": 1}
SHELL = "trap 'exit 0' TERM; while true; do sleep 1; done"
PROBE = (
    'env; echo ---; for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && stat -c \'%n %t %T\' "$f"; done;'
    " echo ---; head -c1 {own} 2>&1; echo ---; mknod /tmp/other c 195 {other} && head -c1 /tmp/other 2>&1; true"
)


def busybox_version(example: str) -> str:
    """The example's manifests with busybox containers that stay up, in namespace gpuplane-cdi-<example>."""
    old, new = f"gpuplane-ex-{example}", f"gpuplane-cdi-{example}"
    docs = []
    for path in sorted((EXAMPLES / example).glob("*.yaml")):
        for original in yaml.safe_load_all(path.read_text()):
            if not original:
                continue
            doc = json.loads(json.dumps(original).replace(f'"{old}"', f'"{new}"'))
            spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc.get("spec")
            if doc["kind"] in ("Pod", "Deployment"):
                spec["terminationGracePeriodSeconds"] = 2
                for container in spec["containers"]:
                    container.update(image=images.BUSYBOX_IMAGE, command=["sh", "-c", SHELL])
            docs.append(doc)
    return "\n---\n".join(json.dumps(d) for d in docs)


@pytest.fixture
def case(only_real_nodes: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    example = str(request.param)
    only_real_nodes.gpu.cluster.apply(busybox_version(example))
    try:
        yield example
    finally:
        only_real_nodes.kubectl(
            "delete", "namespace", f"gpuplane-cdi-{example}", "--wait=true", "--timeout=120s", timeout=150
        )
        only_real_nodes.wait_clean()


def probe(real: RealCluster, pod: dict[str, Any], container: str, own: int, other: int) -> dict[str, Any]:
    """Run the probe script in the container; return its env, NVIDIA nodes and the two open results."""
    out = real.exec(
        pod["metadata"]["namespace"],
        pod["metadata"]["name"],
        "sh",
        "-c",
        PROBE.format(own=f"/dev/nvidia{own}", other=other),
        container=container,
    )
    env_text, nodes_text, own_text, other_text = out.split("---\n")
    env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    nodes = {}
    for line in nodes_text.splitlines():
        path, major, minor = line.split()
        nodes[path] = (int(major, 16), int(minor, 16))
    return {"env": env, "devices": nodes, "own": own_text.strip(), "other": other_text.strip()}


@pytest.mark.parametrize("case", sorted(CASES), indirect=True)
def test_container_sees_its_allocation(
    only_real_nodes: RealCluster, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    real = only_real_nodes
    namespace = f"gpuplane-cdi-{case}"
    pods = real.gpu.running_pods(namespace, CASES[case], timeout=180)
    seen_containers = 0
    priorities: dict[str, int] = {}  # device class -> the priority its container's env shows
    priority_lines: list[str] = []
    for pod in pods:
        node = real.node(pod["spec"]["nodeName"])
        checkpoint = real.checkpoint(node)
        for container, entries in realchecks.claim_containers(pod).items():
            (entry,) = entries
            claim = real.gpu.claim(namespace, realchecks.pod_claim(pod, entry))
            record = checkpoint.claims[claim["metadata"]["uid"]]
            minors = {d.gpu_minor for d in record.devices}
            other = next(m for m in range(8) if m not in minors)
            seen = probe(real, pod, container, own=min(minors), other=other)
            uuids = realchecks.runtime_uuids(record)
            assert seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(",") == uuids
            assert seen["env"]["CUDA_VISIBLE_DEVICES"].split(",") == uuids
            assert seen["env"]["GPUPLANE_CLAIM_UID"] == record.uid
            for device, uuid in zip(record.devices, uuids, strict=True):
                assert seen["env"][f"GPUPLANE_DEVICE_{device.device.upper().replace('-', '_')}_UUID"] == uuid
            assert seen["devices"] == realchecks.expected_devices(record)
            assert "No such device or address" in seen["own"], seen["own"]  # ENXIO: allowed, no driver behind it
            assert "Operation not permitted" in seen["other"], seen["other"]  # EPERM: another claim's GPU
            if record.sharing.strategy == "MPS":
                daemon_line = check_mps(real, pod, container, node.mps_root / record.uid, record)
                # The tier's MPS client priority, as the container's own environment shows it (issue 15): the
                # class's value (gold 0, bronze 1), and the same in the checkpoint and the daemon (check_mps).
                dclass = (claim["spec"]["devices"]["requests"][0].get("exactly") or {}).get("deviceClassName", "?")
                assert record.sharing.mps_client_priority is not None
                assert seen["env"]["CUDA_MPS_CLIENT_PRIORITY"] == str(record.sharing.mps_client_priority)
                assert dclass in TIER_PRIORITY or case != "mps-tiers", dclass
                if dclass in TIER_PRIORITY:
                    assert record.sharing.mps_client_priority == TIER_PRIORITY[dclass], (dclass, record.sharing)
                priorities[dclass] = int(seen["env"]["CUDA_MPS_CLIENT_PRIORITY"])
                priority_lines += [
                    f"[priority] {namespace}/{pod['metadata']['name']}/{container} class {dclass}: "
                    f"env in container CUDA_MPS_CLIENT_PRIORITY={seen['env']['CUDA_MPS_CLIENT_PRIORITY']}",
                    daemon_line,
                ]
            seen_containers += 1
            print(f"{namespace}/{pod['metadata']['name']}/{container}: {uuids} {sorted(seen['devices'])}")
    assert seen_containers >= CASES[case]
    if case == "mps-tiers":
        assert priorities == {"mps-gold.gpu.gpuplane.dev": 0, "mps-bronze.gpu.gpuplane.dev": 1}, priorities
        with capsys.disabled():
            print("\n" + "\n".join(f"[e2e] {line}" for line in priority_lines))
    if case == "shared-claim":
        producer = next(p for p in pods if p["metadata"]["name"] == "producer")
        assert len(realchecks.claim_containers(producer)) == 2, "the producer pod's two containers share the claim"
    if case == "mig-two-profiles":
        (pod,) = pods
        assert all(
            d.mig is not None
            for d in real.checkpoint(real.node(pod["spec"]["nodeName"]))
            .claims[real.gpu.claim(namespace, "two-slices")["metadata"]["uid"]]
            .devices
        )


def check_mps(real: RealCluster, pod: dict[str, Any], container: str, claim_dir: Path, record: Any) -> str:
    """The container's pipe dir is its claim's daemon's, and that daemon runs with the claim's limits.

    Returns the line that shows the daemon's client priority.
    """
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    listing = real.exec(ns, name, "ls", CONTAINER_PIPE_DIR, container=container).split()
    assert "control" in listing and PID_FILE in listing, listing
    pid = int(real.exec(ns, name, "cat", f"{CONTAINER_PIPE_DIR}/{PID_FILE}", container=container).strip())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "nvidia-cuda-mps-control" in cmdline
    standin = json.loads((claim_dir / "log" / "standin-record.json").read_text())
    assert standin["pid"] == pid and standin["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(claim_dir / "pipe")
    defaults = standin["defaults"]
    assert defaults["active_thread_percentage"] == record.sharing.mps_active_thread_percentage
    assert defaults["client_priority"] == record.sharing.mps_client_priority
    assert standin["env"]["CUDA_MPS_CLIENT_PRIORITY"] == str(record.sharing.mps_client_priority)
    limits = set(defaults["device_pinned_mem_limit_mib"].values())
    assert limits == {v // 2**20 for v in record.sharing.mps_pinned_limits.values()}
    return (
        f"[priority] daemon pid {pid} of claim {record.uid}: default client priority {defaults['client_priority']}, "
        f"daemon env CUDA_MPS_CLIENT_PRIORITY={standin['env']['CUDA_MPS_CLIENT_PRIORITY']}"
    )
