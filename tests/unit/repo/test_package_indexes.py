"""Package indexes: every package's ``__init__`` docstring names each of its modules and sub-packages.

README and ``docs/architecture.md`` send readers to the packages' ``__init__`` docstrings for the
list of what each package holds, so a module missing from its index is a module a reader cannot
find. A name counts when it stands inside backticks (``name``, :mod:`pkg.name`). A package may
instead say where its modules are listed ("listed in :mod:`e2e`"): then that package's docstring
must name them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TOPS = ("gpuplane", "e2e", "bench", "tests")
LISTED_IN = re.compile(r"listed\s+in\s+:mod:`([\w.]+)`")
# Modules whose package index is being edited on another branch (its owner adds them there); each
# must still be unlisted, so an entry cannot outlive its reason. Empty when no such branch is open.
PENDING: set[str] = set()


def _doc(init: Path) -> str:
    return ast.get_docstring(ast.parse(init.read_text())) or ""


def _named(doc: str) -> set[str]:
    """Every identifier inside a backticked span of ``doc``."""
    return {name for span in re.findall(r"`+([^`]+)`+", doc) for name in re.findall(r"[A-Za-z_]\w*", span)}


def _packages(root: Path) -> Iterator[Path]:
    for top in TOPS:
        for init in sorted((root / top).rglob("__init__.py")):
            if "_proto" not in init.parts and "__pycache__" not in init.parts:
                yield init.parent


def _children(package: Path) -> Iterator[Path]:
    for child in sorted(package.iterdir()):
        if child.name.startswith(("_", ".")):
            continue
        if child.suffix == ".py" or (child / "__init__.py").is_file():
            yield child


def unlisted(root: Path) -> list[str]:
    """The modules and sub-packages under ``root`` that their package's index does not name."""
    missing = []
    for package in _packages(root):
        doc = _doc(package / "__init__.py")
        names = _named(doc)
        for target in LISTED_IN.findall(doc):
            names |= _named(_doc(root.joinpath(*target.split(".")) / "__init__.py"))
        for child in _children(package):
            rel = child.relative_to(root).as_posix()
            if child.name.removesuffix(".py") not in names and rel not in PENDING:
                missing.append(rel)
            if rel in PENDING and child.name.removesuffix(".py") in names:
                missing.append(f"{rel} is listed now: drop it from PENDING")
    return missing


def test_every_module_is_named_in_its_package_index() -> None:
    assert unlisted(REPO) == []


def test_every_package_index_has_a_docstring() -> None:
    assert [p.relative_to(REPO).as_posix() for p in _packages(REPO) if not _doc(p / "__init__.py")] == []


def test_the_index_check_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "e2e" / "plane"
    pkg.mkdir(parents=True)
    (tmp_path / "e2e" / "__init__.py").write_text('"""Index.\n\n- ``plane``: things; ``kubelet``: a stand-in.\n"""\n')
    (pkg / "__init__.py").write_text('"""Plane; modules are listed in :mod:`e2e`."""\n')
    (pkg / "kubelet.py").write_text('"""A stand-in."""\n')
    assert unlisted(tmp_path) == []
    (pkg / "chaos.py").write_text('"""Faults."""\n')
    assert unlisted(tmp_path) == ["e2e/plane/chaos.py"]
