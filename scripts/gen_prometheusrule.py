#!/usr/bin/env python3
"""Write the PrometheusRule (Prometheus Operator) from gpuplane's plain Prometheus rules file, its one source.

    python scripts/gen_prometheusrule.py          # writes manifests/monitoring/prometheus-operator/prometheusrule.yaml
    python scripts/gen_prometheusrule.py --check  # exit 1 (and say so) when the committed file differs

The rule groups are copied as data (comments are the source's); ``tests/unit/repo/test_monitoring_rules.py``
checks that the committed manifest is exactly what this writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "manifests" / "monitoring" / "prometheus" / "gpuplane.rules.yaml"
TARGET = REPO / "manifests" / "monitoring" / "prometheus-operator" / "prometheusrule.yaml"
HEADER = (
    "# Generated from manifests/monitoring/prometheus/gpuplane.rules.yaml by scripts/gen_prometheusrule.py:\n"
    "# edit that file and run the script (tests/unit/repo/test_monitoring_rules.py checks that they agree).\n"
)


class _Dumper(yaml.SafeDumper):
    """Literal blocks for text of several lines, folded ones for long lines (as the source writes them)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ">" if len(value) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(rules_text: str) -> str:
    """The PrometheusRule manifest for the rules file's text."""
    rules = yaml.safe_load(rules_text)
    body: dict[str, Any] = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "gpuplane", "labels": {"app.kubernetes.io/name": "gpuplane"}},
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.dump(body, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    a = p.parse_args(argv)
    want = render(SOURCE.read_text())
    if a.check:
        if TARGET.read_text() != want:
            print(f"{TARGET.relative_to(REPO)} is not generated from {SOURCE.relative_to(REPO)}: run {sys.argv[0]}")
            return 1
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(want)
    print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
