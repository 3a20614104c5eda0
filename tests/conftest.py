"""Test-suite switches: end-to-end tests (marker ``e2e``) run only with ``--e2e`` or ``GPUPLANE_E2E=1``."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--e2e",
        action="store_true",
        default=False,
        help="run end-to-end tests against a real control plane (also: GPUPLANE_E2E=1)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--e2e") or os.environ.get("GPUPLANE_E2E") == "1":
        return
    skip = pytest.mark.skip(reason="end-to-end test: run with --e2e or GPUPLANE_E2E=1")
    for item in items:
        # Not `"e2e" in item.keywords`: keywords include directory names such as tests/e2e.
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(skip)
