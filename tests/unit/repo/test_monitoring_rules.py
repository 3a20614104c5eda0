"""gpuplane's alerting rules: ``promtool check rules`` and ``promtool test rules``, and their one source.

The rules live in ``manifests/monitoring/prometheus/gpuplane.rules.yaml``; the PrometheusRule in
``manifests/monitoring/prometheus-operator/`` is generated from them (``scripts/gen_prometheusrule.py``).
``tests/unit/repo/rules/*.test.yaml`` give each alert input series and the alerts expected (labels and
rendered annotations) while it fires and while it must not. promtool is Debian's ``prometheus``
package (``scripts/setup-monitoring.sh``); where it is missing these tests skip, except in CI
(``CI=true`` or ``GPUPLANE_REAL_NODES=required``), where that is a failure.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests import hosttools

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "manifests" / "monitoring" / "prometheus" / "gpuplane.rules.yaml"
OPERATOR = REPO / "manifests" / "monitoring" / "prometheus-operator"
RULE_TESTS = sorted((REPO / "tests" / "unit" / "repo" / "rules").glob("*.test.yaml"))
DOCS = REPO / "docs"


def promtool() -> str:
    """promtool's path; skips where it is missing, fails in CI."""
    return hosttools.required_tool(
        "promtool", installer="scripts/setup-monitoring.sh", what="Debian's prometheus package"
    )


def alerts() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    argv = [promtool(), "check", "rules", str(RULES)]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_tests_every_alert() -> None:
    assert RULE_TESTS, "no rule tests found"
    done = subprocess.run(
        [promtool(), "test", "rules", *(p.name for p in RULE_TESTS)],
        cwd=RULE_TESTS[0].parent,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_each_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test") or []:
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - firing == set(), "alerts no test sees firing"
    assert names - quiet == set(), "alerts no test sees quiet (below the threshold or the for: duration)"
    assert firing | quiet <= names, "tests of alerts that do not exist"


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    out, fenced = set(), False
    for line in doc.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"#+\s+(.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_each_alert_says_what_it_means_and_where_its_runbook_is() -> None:
    for alert in alerts():
        name = alert["alert"]
        assert re.fullmatch(r"Gpuplane[A-Z]\w+", name)
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        notes = alert["annotations"]
        assert set(notes) == {"summary", "description", "runbook"}, name
        assert len(notes["description"]) > 100, f"{name}: say what it means and what to do next"
        doc, _, anchor = notes["runbook"].partition("#")
        assert doc in {"docs/operations.md", "docs/health.md"}, name
        assert anchor in _anchors(REPO / doc), f"{name}: {notes['runbook']} names no heading"


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_prometheusrule", REPO / "scripts" / "gen_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_prometheusrule_is_generated_from_the_rules_file() -> None:
    manifest = OPERATOR / "prometheusrule.yaml"
    assert manifest.read_text() == _generator().render(RULES.read_text()), "run python scripts/gen_prometheusrule.py"
    body = yaml.safe_load(manifest.read_text())
    assert (body["apiVersion"], body["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert body["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_the_prometheusrule_stays_out_of_the_default_install() -> None:
    """Without the Prometheus Operator's CRD it would fail ``kubectl apply -k manifests/``: its own kustomization."""
    assert yaml.safe_load((OPERATOR / "kustomization.yaml").read_text())["resources"] == ["prometheusrule.yaml"]
    monitoring = yaml.safe_load((REPO / "manifests" / "monitoring" / "kustomization.yaml").read_text())
    assert monitoring["resources"] == ["metrics-reader.yaml"]
