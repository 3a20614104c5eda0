"""Noisy-neighbour detector: threshold, sustain time, hysteresis, tier order, departures."""

from __future__ import annotations

import pytest

from gpuplane.driver.observe.noisy import NoisyNeighbourDetector, NoisySettings, Tenant

GOLD = Tenant("g", "prod", "serve", "gold")
SILVER = Tenant("s", "dev", "tune", "silver")
BRONZE = Tenant("b", "batch", "train", "bronze")
S = NoisySettings(threshold=0.5, release=0.4, sustain_s=30.0)


def test_raises_after_sustain_with_a_higher_tier_present() -> None:
    d = NoisyNeighbourDetector(S)
    tenants = [GOLD, SILVER, BRONZE]
    assert d.update("gpu-0", tenants, {"b": 0.7}, now=0.0) == []
    assert d.update("gpu-0", tenants, {"b": 0.7}, now=29.0) == []
    (tr,) = d.update("gpu-0", tenants, {"b": 0.7}, now=30.0)
    assert tr.raised and tr.alert.hog == BRONZE and tr.alert.victims == (GOLD, SILVER)
    assert tr.alert.since == 0.0
    assert d.update("gpu-0", tenants, {"b": 0.9}, now=40.0) == []  # raised once
    assert d.active()[0].share == 0.9


def test_dip_restarts_the_clock_and_hysteresis_holds() -> None:
    d = NoisyNeighbourDetector(S)
    t = [GOLD, BRONZE]
    d.update("gpu-0", t, {"b": 0.6}, 0.0)
    d.update("gpu-0", t, {"b": 0.45}, 20.0)  # below threshold before sustain: restart
    assert d.update("gpu-0", t, {"b": 0.6}, 40.0) == []
    assert d.update("gpu-0", t, {"b": 0.6}, 69.0) == []
    assert d.update("gpu-0", t, {"b": 0.6}, 70.0)[0].raised
    assert d.update("gpu-0", t, {"b": 0.45}, 80.0) == []  # inside the band: still active
    (tr,) = d.update("gpu-0", t, {"b": 0.39}, 90.0)
    assert not tr.raised and d.active() == []


def test_no_alert_without_a_higher_tier_or_for_the_top_tier() -> None:
    d = NoisyNeighbourDetector(S)
    assert d.update("gpu-0", [BRONZE, Tenant("b2", "x", "y", "bronze")], {"b": 1.0}, 0.0) == []
    assert d.update("gpu-0", [BRONZE, Tenant("b2", "x", "y", "bronze")], {"b": 1.0}, 100.0) == []
    assert d.update("gpu-1", [GOLD, BRONZE], {"g": 1.0}, 0.0) == []
    assert d.update("gpu-1", [GOLD, BRONZE], {"g": 1.0}, 100.0) == []


def test_victim_or_hog_leaving_clears() -> None:
    d = NoisyNeighbourDetector(S)
    d.update("gpu-0", [GOLD, BRONZE], {"b": 0.8}, 0.0)
    assert d.update("gpu-0", [GOLD, BRONZE], {"b": 0.8}, 30.0)[0].raised
    (tr,) = d.update("gpu-0", [BRONZE], {"b": 0.8}, 40.0)
    assert not tr.raised
    d.update("gpu-0", [GOLD, BRONZE], {"b": 0.8}, 50.0)
    assert d.update("gpu-0", [GOLD, BRONZE], {"b": 0.8}, 80.0)[0].raised
    (tr,) = d.update("gpu-0", [GOLD], {}, 90.0)
    assert not tr.raised and tr.alert.hog == BRONZE
    assert d.forget_gpu("gpu-0", 100.0) == []


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        NoisySettings(threshold=0.3, release=0.5)
