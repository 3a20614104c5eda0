"""The repository layout: one import package, ``gpuplane``; top-level ``driver/`` and ``controller/`` only lead to it.

``driver`` and ``controller`` at the top level are symbolic links to ``gpuplane/driver`` and
``gpuplane/controller``. Python run from the repository root could import them under those
bare names too, which would load a second copy of every module (a second Prometheus registry,
classes that are not ``isinstance`` of themselves). ruff's banned-api rule (TID251) refuses
such imports; this test also catches what ruff cannot see: module paths written as strings
(``python -m driver.main`` in a subprocess argv).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINKS = {"driver": "gpuplane/driver", "controller": "gpuplane/controller"}
CODE_IMPORT = re.compile(r"^\s*(from|import) (driver|controller)\b", re.MULTILINE)


def _tracked_python_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    this = Path(__file__).resolve()
    return [REPO / line for line in out.splitlines() if line and "/_proto/" not in line and REPO / line != this]


def _bare_module_names() -> set[str]:
    """Every module under gpuplane/driver and gpuplane/controller, named the wrong way (``driver.main``)."""
    names: set[str] = set()
    for top in LINKS:
        for path in (REPO / "gpuplane" / top).rglob("*.py"):
            parts = path.relative_to(REPO / "gpuplane").with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if len(parts) > 1:  # "driver" alone is also a word (a field name, a log file)
                names.add(".".join(parts))
    return names


def test_top_level_driver_and_controller_are_links_into_the_package() -> None:
    for name, target in LINKS.items():
        link = REPO / name
        assert link.is_symlink(), f"{name}/ must be a symlink to {target}/"
        assert os.readlink(link) == target
        assert (REPO / target / "__init__.py").is_file()


def test_nothing_imports_the_bare_names() -> None:
    bad: list[str] = []
    for path in _tracked_python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            bad += [f"{path.relative_to(REPO)}:{node.lineno}: {m}" for m in mods if m.split(".")[0] in LINKS]
    assert bad == [], "import gpuplane.driver / gpuplane.controller instead:\n" + "\n".join(bad)


def test_no_bare_module_path_in_strings() -> None:
    """Module paths for ``python -m`` and code run with ``python -c`` are strings ruff does not read."""
    bare = _bare_module_names()
    assert "driver.main" in bare and "controller.main" in bare  # the scan below looks for real names
    bad: list[str] = []
    for path in _tracked_python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if node.value in bare or CODE_IMPORT.search(node.value):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:60]!r}")
    assert bad == [], "name modules gpuplane.<...> (python -m gpuplane.driver.main):\n" + "\n".join(bad)
