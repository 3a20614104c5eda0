"""The driver's noisy-neighbour taints: one per GPU, figures frozen at the raise, merged with health taints."""

from __future__ import annotations

from gpuplane.api import noisy_taint
from gpuplane.controller.rebalance import signal
from gpuplane.driver.observe import noisy
from gpuplane.driver.observe.noisy_taints import NoisyTaints, merged
from gpuplane.driver.publish.slices import DeviceTaint

HOG = "0b9c3f52-6a1e-4c7d-9e8f-1a2b3c4d5e6f"
GOLD = noisy.Tenant("1c8d4a63-7b2f-4d8e-8f90-2b3c4d5e6f70", "team", "gold", "gold")
BRONZE = noisy.Tenant(HOG, "team", "bronze", "bronze")


def test_a_raised_alert_becomes_a_taint_the_controller_reads_back() -> None:
    settings = noisy.NoisySettings(threshold=0.5, release=0.4, sustain_s=30)
    det = noisy.NoisyNeighbourDetector(settings)
    taints = NoisyTaints(det.active, settings)
    assert taints.refresh() is False and taints.taints() == {}
    det.update("gpu-3", [GOLD, BRONZE], {HOG: 0.8}, 1_800_000_000.0)
    det.update("gpu-3", [GOLD, BRONZE], {HOG: 0.8}, 1_800_000_031.0)  # sustained: raised
    assert taints.refresh() is True
    (t,) = taints.taints()["gpu-3"]
    assert (t.key, t.effect, t.time_added) == (noisy_taint.KEY, "None", "2027-01-15T08:00:30Z")
    assert noisy_taint.decode(t.value) == noisy_taint.NoisyFigures(HOG, 80, 50, 30)
    # The share moves; the taint keeps the figures of the raise (no slice rewrite every tick).
    det.update("gpu-3", [GOLD, BRONZE], {HOG: 0.9}, 1_800_000_041.0)
    assert taints.refresh() is False
    # What the controller reads from the published slice.
    published = {
        "spec": {
            "driver": "gpu.gpuplane.dev",
            "nodeName": "n",
            "pool": {"name": "n"},
            "devices": [
                {
                    "name": "gpu-3",
                    "taints": [{"key": t.key, "value": t.value, "effect": t.effect, "timeAdded": t.time_added}],
                }
            ],
        }
    }
    (alert,) = signal.alerts([published])
    assert alert.figures.hog_uid == HOG and alert.since == 1_800_000_030.0
    # Cleared: below the release threshold.
    det.update("gpu-3", [GOLD, BRONZE], {HOG: 0.1}, 1_800_000_051.0)
    assert taints.refresh() is True and taints.taints() == {}


def test_merged_sources_keep_every_taint_of_a_device() -> None:
    health = DeviceTaint("gpu.gpuplane.dev/xid", "48", "NoSchedule")
    noisy_t = DeviceTaint(noisy_taint.KEY, f"{HOG}_80_50_30", "None")
    both = merged(lambda: {"gpu-1": [health]}, lambda: {"gpu-1": [noisy_t], "gpu-2": [noisy_t]})()
    assert both == {"gpu-1": [health, noisy_t], "gpu-2": [noisy_t]}
