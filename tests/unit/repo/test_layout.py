"""The repository layout: one import package, ``gpuplane``; top-level ``driver/`` and ``controller/`` only lead to it.

``driver`` and ``controller`` at the top level are symbolic links to ``gpuplane/driver`` and
``gpuplane/controller``. Python run from the repository root could import them under those
bare names too, which would load a second copy of every module (a second Prometheus registry,
classes that are not ``isinstance`` of themselves). ruff's banned-api rule (TID251) refuses
such imports in code; this test also reads what ruff cannot: module paths written as strings
(``python -m ...`` in an argv, a docstring or a README, code run with ``python -c``), which
must name a module that exists, by its ``gpuplane.*`` name.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LINKS = {"driver": "gpuplane/driver", "controller": "gpuplane/controller"}
FIRST_PARTY = {"gpuplane", "e2e", "bench", "tests", *LINKS}
PYTHON_M = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")
CODE_IMPORT = re.compile(r"^\s*(?:from ([\w.]+) import ([\w, ]+)|import ([\w.]+))", re.MULTILINE)


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout
    this = Path(__file__).resolve()
    return [REPO / p for p in out.splitlines() if p and "/_proto/" not in p and REPO / p != this]


def _module_file(module: str) -> Path | None:
    """The file that defines ``module`` in this repository, or None (bare link names never count)."""
    if module.split(".", maxsplit=1)[0] in LINKS:
        return None
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defines(init: Path, name: str) -> bool:
    for node in ast.parse(init.read_text()).body:
        targets: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            targets = [node.name]
        elif isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.ImportFrom | ast.Import):
            targets = [(a.asname or a.name).split(".")[0] for a in node.names]
        if name in targets:
            return True
    return False


def _problems_in_code(code: str) -> Iterator[str]:
    """Imports in code held in a string: the module must exist; a package's name must be a module or defined."""
    for m in CODE_IMPORT.finditer(code):
        module = m.group(1) or m.group(3)
        if module.split(".")[0] not in FIRST_PARTY:
            continue
        found = _module_file(module)
        if found is None:
            yield f"no module {module}"
        elif m.group(1) and found.name == "__init__.py":
            for name in (n.strip() for n in m.group(2).split(",")):
                if name and _module_file(f"{module}.{name}") is None and not _defines(found, name):
                    yield f"{module} has no {name}"


def _strings(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _dash_m_arguments(path: Path) -> Iterator[tuple[int, str]]:
    """``"-m", "<module>"`` in list and tuple literals (subprocess argvs)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.List | ast.Tuple):
            elts = node.elts
            for a, b in itertools.pairwise(elts):
                if isinstance(a, ast.Constant) and a.value == "-m" and isinstance(b, ast.Constant):
                    yield b.lineno, str(b.value)


def test_top_level_driver_and_controller_are_links_into_the_package() -> None:
    for name, target in LINKS.items():
        link = REPO / name
        assert link.is_symlink(), f"{name}/ must be a symlink to {target}/"
        assert os.readlink(link) == target
        assert (REPO / target / "__init__.py").is_file()


def test_nothing_imports_the_bare_names() -> None:
    bad: list[str] = []
    for path in _tracked("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            bad += [f"{path.relative_to(REPO)}:{node.lineno}: {m}" for m in mods if m.split(".")[0] in LINKS]
    assert bad == [], "import gpuplane.driver / gpuplane.controller instead:\n" + "\n".join(bad)


def test_module_paths_in_strings_and_docs_exist() -> None:
    bad: list[str] = []
    for path in _tracked("*.py"):
        rel = path.relative_to(REPO)
        for line, text in _strings(path):
            bad += [f"{rel}:{line}: {p}" for p in _problems_in_code(text)]
        for line, module in _dash_m_arguments(path):
            if module.split(".")[0] in FIRST_PARTY and _module_file(module) is None:
                bad.append(f"{rel}:{line}: -m {module}")
    for path in _tracked("*.py", "*.md", "*.sh", "*.yaml", "*.toml", "Dockerfile*"):
        for n, text in enumerate(path.read_text().splitlines(), 1):
            for found in PYTHON_M.findall(text):
                module = found.rstrip(".")
                if module.split(".")[0] in FIRST_PARTY and _module_file(module) is None:
                    bad.append(f"{path.relative_to(REPO)}:{n}: python -m {module}")
    assert bad == [], "name modules that exist, as gpuplane.<...> (python -m gpuplane.driver.main):\n" + "\n".join(bad)


def test_the_checks_above_can_fail() -> None:
    """The scanners recognise the mistakes they exist for."""
    assert _module_file("gpuplane.driver.main") is not None
    assert _module_file("driver.main") is None  # resolvable through the link, refused by name
    assert list(_problems_in_code("from driver import mps\n")) == ["no module driver"]
    assert list(_problems_in_code("import sys\nfrom e2e import procs\n")) == ["e2e has no procs"]
    assert list(_problems_in_code("from e2e.cluster import procs\n")) == []
    assert PYTHON_M.findall("run python -m driver.cost summary") == ["driver.cost"]


MAX_MODULE_LINES = 400


def _oversized(paths: list[Path], limit: int = MAX_MODULE_LINES) -> list[str]:
    return [f"{p.relative_to(REPO)}: {n} lines" for p in paths if (n := len(p.read_text().splitlines())) > limit]


def test_no_hand_written_module_passes_400_lines() -> None:
    """Generated protobuf code (``_proto``) is exempt; everything else, code and tests, stays small."""
    assert _oversized(_tracked("*.py")) == [], f"split these by what they do (limit {MAX_MODULE_LINES} lines)"


def test_the_size_check_can_fail(tmp_path: Path) -> None:
    big = REPO / "tests" / "unit" / "repo" / "test_layout.py"
    assert _oversized([big], limit=10) == [f"tests/unit/repo/test_layout.py: {len(big.read_text().splitlines())} lines"]
