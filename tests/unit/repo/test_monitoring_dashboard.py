"""The Grafana dashboard, and every metric the dashboard and the alerting rules name is one the code exports.

The exported names come from the metric classes themselves, each on a fresh ``CollectorRegistry``
(the driver's, its health watcher's and telemetry's after one real sampling tick on the simulator,
the controller's), as the names a scrape shows: a counter ``x`` is ``x_total`` (and ``x_created``),
a histogram ``x_bucket``, ``x_sum`` and ``x_count``. No source text is read for them. The names in
an expression are what is left of it once strings, label matchers, ranges, grouping clauses,
keywords and function calls are taken out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpuplane.controller.metrics import ControllerMetrics
from gpuplane.driver.metrics import DriverMetrics
from gpuplane.driver.observe.health_watcher import HealthMetrics
from gpuplane.driver.observe.telemetry import TelemetrySampler, TelemetrySettings
from gpuplane.driver.observe.telemetry_metrics import TelemetryMetrics
from testing.driverkit import driver_env

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "manifests" / "monitoring" / "grafana" / "gpuplane.json"
RULES = REPO / "manifests" / "monitoring" / "prometheus" / "gpuplane.rules.yaml"
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}


def names_of(registry: CollectorRegistry) -> set[str]:
    """Every series name a scrape of ``registry`` can show: its samples' names, and the names each family's type
    gives (a labelled family shows no sample before its first child)."""
    out: set[str] = set()
    for family in registry.collect():
        out |= {s.name for s in family.samples}
        out |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return out


@pytest.fixture(scope="module")
def exported() -> set[str]:
    driver = CollectorRegistry()
    DriverMetrics(driver)
    HealthMetrics(driver)
    telemetry = TelemetryMetrics(driver)
    with driver_env("hgx-h100", prefix="mn", durable=False) as drv:
        sampler = TelemetrySampler(
            drv.sim,
            TelemetrySettings(),
            telemetry,
            inventory=drv.state.inventory,
            checkpoint=drv.state.snapshot,
            tiers=lambda _rec: "whole",
        )
        sampler.tick()  # the device gauges (DCGM names) and the claim families, as the driver serves them
    return names_of(driver) | names_of(ControllerMetrics().registry)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (Grafana's ``$variables`` allowed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    found = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if not m.group(2) and m.group(1) not in KEYWORDS:
            found.add(m.group(1))
    return found


def test_the_extraction_finds_metrics_and_only_metrics() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, kind) (rate(a_bucket{op="x", y=~"b|c"}[$__rate_interval]))) '
        "> 2 and on (instance) (b_total offset 5m == bool 1) or absent(c) unless vector(0) * 1e3"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels") or []


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in panels(dashboard) for t in p.get("targets") or []]


def test_the_dashboard_is_one_grafana_imports_as_it_is() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert {"title", "uid", "panels", "schemaVersion", "templating", "time"} <= set(dashboard)
    assert "__inputs" not in dashboard and dashboard.get("id") is None  # no export-time placeholders
    (var,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert (var["type"], var["query"]) == ("datasource", "prometheus")
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels(dashboard):
        assert {"type", "title", "gridPos", "id"} <= set(panel), panel.get("title")
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["refId"] and target["expr"]


def test_the_dashboard_covers_the_fleet_the_driver_the_controller_and_tenants(exported: set[str]) -> None:
    named = {n for _, expr in dashboard_exprs() for n in metric_names(expr)}
    for wanted in (
        "gpuplane_driver_devices_published",
        "gpuplane_driver_devices_prepared",
        "gpuplane_fleet_largest_free_block_gpus",
        "gpuplane_device_taint",
        "gpuplane_driver_prepare_duration_seconds_bucket",
        "gpuplane_driver_errors_total",
        "gpuplane_driver_mig_instances",
        "gpuplane_driver_mps_daemons",
        "gpuplane_driver_mig_instances_owed",
        "gpuplane_controller_is_leader",
        "gpuplane_gang_queue_depth",
        "gpuplane_gang_decisions_total",
        "gpuplane_steer_gate_seconds_bucket",
        "gpuplane_gpu_seconds_total",
    ):
        assert wanted in named, wanted


def test_the_dashboard_names_only_exported_metrics(exported: set[str]) -> None:
    unknown = [(title, n) for title, expr in dashboard_exprs() for n in sorted(metric_names(expr) - exported)]
    assert unknown == [], "panels reading metrics the code does not export"


def test_the_rules_name_only_exported_metrics(exported: set[str]) -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert rules
    unknown = [(r["alert"], n) for r in rules for n in sorted(metric_names(r["expr"]) - exported)]
    assert unknown == [], "alerts reading metrics the code does not export"


def test_the_exported_names_are_what_a_scrape_shows(exported: set[str]) -> None:
    assert {"gpuplane_driver_errors_total", "gpuplane_driver_resourceslice_writes_total"} <= exported
    assert {"gpuplane_driver_rpc_duration_seconds_bucket", "gpuplane_gang_wait_seconds_count"} <= exported
    assert {"DCGM_FI_PROF_SM_ACTIVE", "gpuplane_claim_device_fraction", "gpuplane_noisy_neighbour"} <= exported
    assert "gpuplane_driver_errors" not in exported and "gpuplane_gang_wait_seconds" not in exported
