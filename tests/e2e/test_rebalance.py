"""End to end: a noisy bronze neighbour is moved off the GPU it shares with a gold claim, or is not (PDB).

One simulated ``hgx-h100`` node of this module's own (a real ``gpuplane-driver`` under its
node-bound token, telemetry every second, an alert raised after 2 s above the threshold) and the
session's controllers (``--noisy-persist=5 --rebalance-cooldown=60`` in the e2e harness), on the
real control plane: kube-scheduler allocates, kube-controller-manager's ReplicaSet controller
makes the replacement and its disruption controller keeps the PodDisruptionBudget's status.

A gold MPS claim (60 %) and a bronze Deployment's claim (20 %) share GPU 0; the simulator's
controls inject a memory-bandwidth hog on the bronze MPS daemon's process. The driver raises the
alert and publishes it as a device taint; the controller evicts the bronze pod through the
Eviction API after a DeviceTaintRule keeps its replacement off GPU 0; the replacement runs on
another GPU; the gold pod is untouched; the move is in the ledger. With a PodDisruptionBudget
that forbids it, nothing is evicted and an Event says why.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.plane import components, nodes, simnodes
from gpuplane.api import kubetime
from gpuplane.driver.hw.sim import gpu_uuid
from gpuplane.driver.sharing.mps import MpsControl
from tests.e2e.conftest import GpuCluster, eventually

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DRIVER_ENV = {"GPUPLANE_TELEMETRY_INTERVAL": "1", "GPUPLANE_NOISY_SUSTAIN": "2", "GPUPLANE_REPUBLISH_INTERVAL": "5"}


@pytest.fixture(scope="module")
def node(gpu_cluster: GpuCluster) -> Iterator[tuple[GpuCluster, simnodes.SimNode]]:
    handle = gpu_cluster.cluster
    assert handle.state_dir is not None
    state_dir = handle.state_dir.resolve()
    saved = {k: os.environ.get(k) for k in DRIVER_ENV}
    os.environ.update(DRIVER_ENV)  # the driver process inherits it
    credentials = components.driver_credentials(handle, components.identities_dir(state_dir))
    sims = simnodes.SimNodes(
        state_dir, handle.kubeconfig, driver_credentials=credentials, die_with_parent=True, out=lambda _: None
    )
    try:
        (sim,) = sims.start([nodes.NodeGroup("hgx-h100", 1)])
        yield gpu_cluster, sim
    finally:
        sims.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def manifests(
    ns: str, node: str, gold_minor: int, bronze_minors: tuple[int, int], pdb: bool, *, granted: bool = True
) -> list[dict[str, Any]]:
    lo, hi = bronze_minors
    minor = 'device.attributes["gpu.gpuplane.dev"].minor'
    # Granted gold by its administrator (tiers are entitlements, issue 32), unless the test says otherwise.
    labels = {"gpuplane.dev/max-tier": "gold"} if granted else {}
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gold", "namespace": ns},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "mps-gold.gpu.gpuplane.dev",
                                "selectors": [{"cel": {"expression": f"{minor} == {gold_minor}"}}],
                                "capacity": {"requests": {"sharePercent": "60"}},
                            },
                        }
                    ]
                }
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gold", "namespace": ns, "labels": {"app": "gold"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gold"}],
                "containers": [
                    {"name": "serve", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "bronze", "namespace": ns},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "mps-bronze.gpu.gpuplane.dev",
                                    "selectors": [{"cel": {"expression": f"{minor} >= {lo} && {minor} <= {hi}"}}],
                                    "capacity": {"requests": {"sharePercent": "20"}},
                                },
                            }
                        ]
                    }
                }
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "bronze", "namespace": ns},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "bronze"}},
                "template": {
                    "metadata": {"labels": {"app": "bronze"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 0,
                        "affinity": {
                            "podAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "labelSelector": {"matchLabels": {"app": "gold"}},
                                        "topologyKey": "kubernetes.io/hostname",
                                    }
                                ]
                            }
                        },
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "bronze"}],
                        "containers": [
                            {
                                "name": "batch",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                    },
                },
            },
        },
    ]
    if pdb:
        objs.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "bronze", "namespace": ns},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "bronze"}}},
            }
        )
    return objs


class Scenario:
    def __init__(self, gpu: GpuCluster, sim: simnodes.SimNode, ns: str) -> None:
        self.gpu, self.sim, self.ns = gpu, sim, ns

    def apply(self, objs: list[dict[str, Any]]) -> None:
        self.gpu.cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))

    def running(self, prefix: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.gpu.pods(self.ns)
            if p["metadata"]["name"].startswith(prefix)
            and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    def claim_of(self, pod: dict[str, Any]) -> dict[str, Any]:
        (ref,) = pod["spec"]["resourceClaims"]
        name = ref.get("resourceClaimName")
        if name is None:  # made from a template: its name is in the pod's status
            (status,) = pod["status"]["resourceClaimStatuses"]
            name = status["resourceClaimName"]
        return self.gpu.claim(self.ns, name)

    @staticmethod
    def device(claim: dict[str, Any]) -> str:
        (r,) = claim["status"]["allocation"]["devices"]["results"]
        return f"{r['pool']}/{r['device']}"

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        items = self.gpu.kubectl_json("get", "events", "-n", self.ns)["items"]
        return [e for e in items if e["involvedObject"]["name"] == name and e["reason"] == reason]

    def hog(self, minor: int, bronze_claim: dict[str, Any], gold_claim: dict[str, Any]) -> None:
        daemons = {d.claim_uid: d.pid for d in MpsControl(self.sim.mps_root, str(simnodes.MPS_STANDIN)).list_daemons()}
        bronze_pid, gold_pid = daemons[bronze_claim["metadata"]["uid"]], daemons[gold_claim["metadata"]["uid"]]
        assert bronze_pid and gold_pid
        subprocess.run(
            self.sim.sim_cli(
                "set-telemetry",
                "--uuid",
                gpu_uuid(self.sim.name, minor),
                "memory_bandwidth_util=0.9",
                f"per_process_bandwidth={bronze_pid}:0.8,{gold_pid}:0.1",
            ),
            check=True,
            capture_output=True,
            cwd=REPO,
            timeout=60,
        )

    def setup(
        self, gold_minor: int, bronze_minors: tuple[int, int], pdb: bool, granted: bool = True
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        self.apply(manifests(self.ns, self.sim.name, gold_minor, bronze_minors, pdb, granted=granted))
        gold = eventually(lambda: self.running("gold"), 120, "gold pod running")[0]
        bronze = eventually(lambda: self.running("bronze-"), 120, "bronze pod running")[0]
        gold_dev, bronze_dev = self.device(self.claim_of(gold)), self.device(self.claim_of(bronze))
        assert gold_dev == bronze_dev == f"{self.sim.name}/gpu-{gold_minor}", (gold_dev, bronze_dev)
        return gold, bronze

    def teardown(self) -> None:
        self.gpu.cluster.kubectl("delete", "namespace", self.ns, "--wait=true", "--timeout=120s", timeout=150)
        self.gpu.cluster.kubectl(
            "delete",
            "devicetaintrules",
            "-l",
            "gpuplane.dev/noisy-neighbour-move=true",
            "--ignore-not-found",
            check=False,
        )


def quote(sc: Scenario, name: str, reason: str) -> list[str]:
    return [
        f"{e['type']} {e['reason']} on {e['involvedObject']['kind']} {sc.ns}/{name}: {e['message']}"
        for e in sc.events(name, reason)
    ]


def ledger_lines(gpu: GpuCluster) -> list[dict[str, Any]]:
    assert gpu.cluster.state_dir is not None
    out = []
    for path in sorted((gpu.cluster.state_dir / "logs").glob("*-moves.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return out


def test_noisy_bronze_pod_is_moved_to_another_gpu_and_gold_is_untouched(
    node: tuple[GpuCluster, simnodes.SimNode], capsys: pytest.CaptureFixture[str]
) -> None:
    gpu, sim = node
    sc = Scenario(gpu, sim, "rebalance-evict")
    try:
        gold, bronze = sc.setup(0, (0, 1), pdb=False)
        gold_claim, bronze_claim = sc.claim_of(gold), sc.claim_of(bronze)
        bronze_name = bronze["metadata"]["name"]
        sc.hog(0, bronze_claim, gold_claim)

        def moved() -> dict[str, Any] | None:
            fresh = [p for p in sc.running("bronze-") if p["metadata"]["name"] != bronze_name]
            return fresh[0] if fresh else None

        replacement = eventually(moved, 180, "the bronze replacement running")
        new_dev = sc.device(sc.claim_of(replacement))
        assert new_dev == f"{sim.name}/gpu-1", new_dev  # kept off gpu-0, still within its selector
        eventually(lambda: not [p for p in gpu.pods(sc.ns) if p["metadata"]["name"] == bronze_name], 60, "old pod gone")
        # The gold pod is untouched: same pod, same claim, same allocation, still running.
        gold_now = gpu.pod(sc.ns, "gold")
        assert gold_now["metadata"]["uid"] == gold["metadata"]["uid"] and gold_now["status"]["phase"] == "Running"
        assert sc.device(sc.claim_of(gold_now)) == f"{sim.name}/gpu-0"
        rule = gpu.kubectl_json("get", "devicetaintrule", f"gpuplane-moved.{sim.name}.gpu-0")
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        assert rule["spec"]["deviceSelector"] == {"driver": "gpu.gpuplane.dev", "pool": sim.name, "device": "gpu-0"}
        evicted = eventually(lambda: quote(sc, bronze_name, "NoisyNeighbourEvicted"), 30, "NoisyNeighbourEvicted")
        assert any("80% of the memory bandwidth" in line and "gold" in line for line in evicted)
        on_claim = quote(sc, bronze_claim["metadata"]["name"], "NoisyNeighbourEvicted")
        on_gold = quote(sc, "gold", "NoisyNeighbourMoved")
        assert on_claim and on_gold
        replaced = eventually(
            lambda: quote(sc, replacement["metadata"]["name"], "NoisyNeighbourReplaced"), 60, "NoisyNeighbourReplaced"
        )
        moves = eventually(lambda: [m for m in ledger_lines(gpu) if m["name"] == bronze_name], 60, "the ledger line")
        (move,) = moves
        assert move["kind"] == "moved" and move["tier"] == "bronze" and move["fraction"] == 0.2
        assert move["device"] == "gpu-0" and move["gpu_seconds"] > 0
        # The charge runs from the eviction to the replacement's Ready time, which Kubernetes records to the
        # second: it ends within that second (moves.charge_end), and is the fraction times that span.
        status = gpu.pod(sc.ns, replacement["metadata"]["name"])["status"]
        recorded = next(
            (c["lastTransitionTime"] for c in status.get("conditions") or [] if c["type"] == "Ready"),
            status.get("startTime"),
        )
        ready_at = kubetime.epoch(recorded)
        assert ready_at is not None, status
        assert move["start"] < move["end"] and ready_at <= move["end"] <= ready_at + 1.0, (move, recorded)
        assert abs(move["gpu_seconds"] - 0.2 * (move["end"] - move["start"])) < 1e-5, move
        with capsys.disabled():
            print(f"\n[e2e] gold and bronze MPS claims on {sim.name}/gpu-0; hog injected on the bronze daemon")
            for line in [*evicted, *on_claim, *on_gold, *replaced]:
                print(f"[e2e] Event {line}")
            print(
                f"[e2e] bronze {bronze_name} -> {replacement['metadata']['name']} on {new_dev}; gold untouched on gpu-0"
            )
            print(f"[e2e] ledger: {json.dumps(move, sort_keys=True)}")
    finally:
        sc.teardown()


def test_pdb_that_forbids_the_move_means_no_eviction_and_an_event_saying_why(
    node: tuple[GpuCluster, simnodes.SimNode], capsys: pytest.CaptureFixture[str]
) -> None:
    gpu, sim = node
    sc = Scenario(gpu, sim, "rebalance-pdb")
    try:
        gold, bronze = sc.setup(4, (4, 5), pdb=True)
        eventually(
            lambda: (
                (gpu.kubectl_json("get", "pdb", "-n", sc.ns, "bronze").get("status") or {}).get("currentHealthy") == 1
            ),
            60,
            "the PDB's status (1 healthy, 0 disruptions allowed)",
        )
        bronze_name = bronze["metadata"]["name"]
        sc.hog(4, sc.claim_of(bronze), sc.claim_of(gold))
        refused = eventually(lambda: quote(sc, bronze_name, "NoisyNeighbourNotMoved"), 120, "NoisyNeighbourNotMoved")
        assert any("disruption budget" in line for line in refused), refused
        on_gold = quote(sc, "gold", "NoisyNeighbourNotMoved")
        assert on_gold
        still = gpu.pod(sc.ns, bronze_name)
        assert still["metadata"]["uid"] == bronze["metadata"]["uid"] and not still["metadata"].get("deletionTimestamp")
        assert not quote(sc, bronze_name, "NoisyNeighbourEvicted")
        listed = gpu.cluster.kubectl("get", "devicetaintrules", "-o", "name")
        assert f"gpuplane-moved.{sim.name}.gpu-4" not in listed  # the rule made before the eviction was removed
        with capsys.disabled():
            for line in [*refused, *on_gold]:
                print(f"[e2e] Event {line}")
    finally:
        sc.teardown()
