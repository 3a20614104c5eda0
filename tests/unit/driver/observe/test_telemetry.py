"""Telemetry sampler on the simulator: DCGM-named gauges with claim labels, attribution, noisy-neighbour events."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.inventory import discover
from gpuplane.driver.observe import attribution, cost, noisy, telemetry, telemetry_metrics, tiers
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, DeviceRecord, MigRecord, SharingRecord


def rec(
    uid: str,
    ns: str,
    name: str,
    minor: int,
    uuid: str,
    *,
    strategy: str = "Exclusive",
    pct: int | None = None,
    mig: MigRecord | None = None,
) -> ClaimRecord:
    dev = DeviceRecord(
        request_names=["r"],
        pool="n1",
        device=f"gpu-{minor}" if mig is None else f"gpu-{minor}-mig-1g-10gb-{mig.start}",
        kind="gpu" if mig is None else "mig",
        gpu_uuid=uuid,
        gpu_minor=minor,
        mig=mig,
    )
    return ClaimRecord(
        uid=uid,
        namespace=ns,
        name=name,
        phase="PrepareCompleted",
        devices=[dev],
        sharing=SharingRecord(strategy=strategy, mps_active_thread_percentage=pct),
    )


class Claims:
    """ResourceClaims as the API returns them (only what the tier lookup reads)."""

    def __init__(self, classes: Mapping[str, str]) -> None:
        self.classes = classes  # name -> device class
        self.gets = 0

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": name.removeprefix("c-")},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": self.classes[name]}}]}},
        }


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None:
        self.seen.append((claim["metadata"]["name"], reason, message))


class Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


def test_class_names_and_tiers() -> None:
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {"name": "a", "firstAvailable": [{"name": "x", "deviceClassName": "mps-gold.gpu.gpuplane.dev"}]},
                    {"name": "b", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}},
                ]
            }
        }
    }
    assert tiers.class_names(claim) == ["mps-gold.gpu.gpuplane.dev", "gpu.gpuplane.dev"]
    assert tiers.tier_from_classes(["gpu.gpuplane.dev", "mps-gold.gpu.gpuplane.dev"], {}) == "gold"
    assert tiers.tier_from_classes(["custom"], {"custom": "platinum"}) == "platinum"
    assert tiers.tier_from_classes(["gpu.gpuplane.dev"], {}) is None


def test_attribution_walks_to_the_mps_daemon() -> None:
    parents = {500: 400, 400: 300, 300: 1, 900: 1}
    owner = attribution.attribute([500, 400, 900, 300], {300: "claim-a"}, parents.get)
    assert owner == {500: "claim-a", 400: "claim-a", 300: "claim-a"}
    assert attribution.claim_shares({500: 0.25, 400: 0.1, 900: 0.5}, owner) == {"claim-a": 0.35}


def test_sampler_metrics_noisy_events_and_cost(tmp_path: Path) -> None:
    sim = Simulator(SimConfig(profile="hgx-h100", state_dir=tmp_path / "sim", node_name="n1", durable=False))
    sim.init()
    u = [sim.uuid_of_minor(i) for i in range(8)]
    inv = discover("n1", sim)
    cp = Checkpoint(
        claims={
            "gold1": rec("gold1", "prod", "c-gold1", 0, u[0], strategy="MPS", pct=60),
            "bronze1": rec("bronze1", "batch", "c-bronze1", 0, u[0], strategy="MPS", pct=20),
            "whole1": rec("whole1", "ml", "c-whole1", 1, u[1]),
            "mig1": rec(
                "mig1",
                "ml",
                "c-mig1",
                2,
                u[2],
                mig=MigRecord(parent_uuid=u[2], profile_id=0, profile_name="1g.10gb", start=3, size=1),
            ),
        }
    )
    claims = Claims({"c-gold1": "mps-gold.gpu.gpuplane.dev", "c-bronze1": "mps-bronze.gpu.gpuplane.dev"})
    registry = CollectorRegistry()
    metrics = telemetry_metrics.TelemetryMetrics(registry)
    events = Events()
    clock = Clock()
    acc = cost.CostAccountant(tmp_path / "ledger.jsonl", "n1", sink=metrics)
    sampler = telemetry.TelemetrySampler(
        sim,
        telemetry.TelemetrySettings(interval_s=10, noisy=noisy.NoisySettings(threshold=0.5, release=0.4, sustain_s=20)),
        metrics,
        inventory=lambda: inv,
        checkpoint=lambda: cp,
        tiers=tiers.TierResolver(claims),
        daemon_pids=lambda: {4242: "gold1", 4343: "bronze1"},
        parent_of={5001: 4343}.get,
        events=events,
        accountant=acc,
        clock=clock,
    )
    sim.set_telemetry(
        u[0],
        {
            "sm_active": 0.8,
            "temperature_c": 71,
            "memory_bandwidth_util": 0.9,
            "power_w": 550,
            "per_process_bandwidth": {4242: 0.2, 5001: 0.7},
        },
    )
    sim.set_telemetry(u[1], {"memory_used_bytes": 40 * 1024**3})
    for _ in range(3):
        sampler.tick()
        clock.t += 10
    text = generate_latest(registry).decode()
    # device gauges with DCGM names, one series per claim on the shared GPU
    gold = (
        'DCGM_FI_DEV_GPU_TEMP{GPU_I_PROFILE="",Hostname="n1",UUID="' + u[0] + '",claim="c-gold1",device="nvidia0",'
        'dra_device="gpu-0",gpu="0",modelName="NVIDIA H100 80GB HBM3",namespace="prod",tier="gold"} 71.0'
    )
    assert gold in text
    assert 'claim="c-bronze1"' in text and 'tier="bronze"' in text
    assert 'DCGM_FI_DEV_FB_USED{GPU_I_PROFILE="",Hostname="n1"' in text and "} 40960.0" in text
    assert 'GPU_I_PROFILE="1g.10gb"' in text and 'tier="mig"' in text and 'tier="whole"' in text
    assert 'DCGM_FI_DEV_GPU_TEMP{GPU_I_PROFILE="",Hostname="n1",UUID="' + u[3] + '",claim="",' in text
    assert (
        'gpuplane_claim_memory_bandwidth_share{Hostname="n1",claim="c-bronze1",dra_device="gpu-0",gpu="0",'
        'namespace="batch",tier="bronze"} 0.7'
    ) in text
    assert 'gpuplane_claim_device_fraction{Hostname="n1",claim="c-mig1",dra_device="gpu-2-mig-1g-10gb-3"' in text
    # noisy neighbour: 0.7 >= 0.5 from t=5000, raised at t=5020 (sustain 20 s), events on both claims
    assert [(n, r) for n, r, _ in events.seen] == [("c-bronze1", "NoisyNeighbour"), ("c-gold1", "NoisyNeighbour")]
    assert "70% of the memory bandwidth of gpu-0" in events.seen[0][2]
    assert (
        'gpuplane_noisy_neighbour{Hostname="n1",claim="c-bronze1",dra_device="gpu-0",gpu="0",'
        'namespace="batch",role="hog",tier="bronze"} 1.0' in text
    )
    assert 'gpuplane_noisy_neighbour_events_total{namespace="batch",role="hog",tier="bronze"} 1.0' in text
    assert 'gpuplane_noisy_neighbour_events_total{namespace="prod",role="victim",tier="gold"} 1.0' in text
    # cost: 2 intervals of 10 s charged so far
    assert 'gpuplane_gpu_seconds_total{kind="mps",namespace="prod",tier="gold"} 12.0' in text
    assert 'gpuplane_gpu_seconds_total{kind="mig",namespace="ml",tier="mig"} 2.5' in text
    assert claims.gets == 2  # tiers cached
    # the hog backs off below the release threshold: cleared, Normal events
    sim.set_telemetry(u[0], {"per_process_bandwidth": {4242: 0.2, 5001: 0.3}})
    sampler.tick()
    assert [r for _, r, _ in events.seen[2:]] == ["NoisyNeighbourCleared", "NoisyNeighbourCleared"]
    assert "gpuplane_noisy_neighbour{" not in generate_latest(registry).decode()
    # a released claim's series disappear
    del cp.claims["whole1"]
    sampler.tick()
    assert 'claim="c-whole1"' not in generate_latest(registry).decode().split("gpuplane_gpu_seconds")[0]
