"""Programs from Debian's packages that some tests need (promtool, prometheus, chromium): found, or skipped, or failed.

``required_tool(name, ...)`` returns the first of ``names`` on PATH. Where none is, the test is skipped with
the script that installs it, except in CI (``GPUPLANE_REAL_NODES=required``, as ``.ci/run`` sets it, or
``CI`` set), where a missing program fails the test: CI must run what needs it. The same rule as the real
nodes' (``tests.e2e.realfixtures.skip_or_fail_without_real_nodes``).
"""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    """Whether this run must not skip for a missing program."""
    return os.environ.get("GPUPLANE_REAL_NODES") == "required" or bool(os.environ.get("CI"))


def required_tool(*names: str, installer: str, what: str) -> str:
    """The path of the first of ``names`` on PATH; a skip (a failure in CI) naming ``installer`` otherwise."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    reason = f"{names[0]} not found: {what} (install it with {installer}, as root)"
    if in_ci():
        pytest.fail(reason + "; CI must run the tests that need it")
    pytest.skip(reason)
