"""The import direction of ``gpuplane``, enforced: the contracts ``docs/architecture.md`` lists.

Every ``import`` and ``from ... import`` in every module of the package (also those inside
functions and under ``TYPE_CHECKING``: a type-only import is still a dependency a reader follows)
is resolved to the module it names and checked against :data:`CONTRACTS`, in import-linter's two
kinds:

* **forbidden**: no module under ``source`` imports a module under any of ``forbidden``;
* **layers**: within ``container``, a module of a layer never imports a module of a layer listed
  above it (lower layers know nothing of higher ones; a layer may import itself and any below).

A broken contract fails with every offending import (file, line, what it imports). The checker is
tested on a deliberately wrong import too (:func:`test_a_wrong_import_is_reported`).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "gpuplane"
SHARED = (
    "gpuplane.api",
    "gpuplane.placement",
    "gpuplane.mig",
    "gpuplane.logs",
    "gpuplane.httpauth",
    "gpuplane.informer",
)
PROGRAMS = ("gpuplane.driver", "gpuplane.controller")
KUBERNETES = ("kubernetes", "kopf", "grpc")
CONTROLLER_FEATURES = ("claim", "gang", "imex", "migoffer", "node", "rebalance", "rightsize", "steer")
# What every feature may use: the memo (runtime, each feature's state reached by its type), the writer and its
# vocabulary (kube, steps), names, configuration, metrics. Not here: the read side's helpers for the wiring
# (slim digests slices with node.slice_index; rejects asks claim.checks whether a claim is ours).
CONTROLLER_BASE = (
    "runtime",
    "kube",
    "steps",
    "events",
    "indexed",
    "deviceclass",
    "claimtemplate",
    "periodic",
    "leader",
    "probes",
    "supervisor",
    "config",
    "names",
    "metrics",
    "heap",
    "memdump",
)
# Everything in the controller but its wiring (main, handlers, caches): features, runtime, clients.
CONTROLLER_BELOW_WIRING = (
    "claim",
    "gang",
    "imex",
    "migoffer",
    "node",
    "rebalance",
    "rightsize",
    "steer",
    "runtime",
    "fleet_gauges",
    "kube",
    "events",
    "indexed",
    "slim",
    "rejects",
    "periodic",
    "leader",
    "probes",
    "supervisor",
    "config",
)


@dataclasses.dataclass(frozen=True)
class Forbidden:
    """No module under ``source`` imports one under ``forbidden``."""

    name: str
    source: tuple[str, ...]
    forbidden: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Layers:
    """Within ``container``: ``layers[i]`` never imports ``layers[j]`` for ``j < i`` (listed top first)."""

    name: str
    container: str
    layers: tuple[str, ...]


Contract = Forbidden | Layers

CONTRACTS: tuple[Contract, ...] = (
    Forbidden("the driver never imports the controller", ("gpuplane.driver",), ("gpuplane.controller",)),
    Forbidden("the controller never imports the driver", ("gpuplane.controller",), ("gpuplane.driver",)),
    Forbidden("the shared layers import neither program", SHARED, PROGRAMS),
    Forbidden("the command-line tools import neither program", ("gpuplane.cli",), PROGRAMS),
    Forbidden(
        "placement and MIG geometry are pure: no Kubernetes client", ("gpuplane.placement", "gpuplane.mig"), KUBERNETES
    ),
    Forbidden(
        "the package never imports the harness, benchmarks or tests",
        ("gpuplane",),
        ("e2e", "bench", "tests", "testing"),
    ),
    Forbidden(
        "the controller's features never import its wiring",
        tuple(f"gpuplane.controller.{m}" for m in CONTROLLER_BELOW_WIRING),
        ("gpuplane.controller.main", "gpuplane.controller.handlers", "gpuplane.controller.caches"),
    ),
    Forbidden(
        "the fleet view (node) imports no controller feature",
        ("gpuplane.controller.node",),
        tuple(f"gpuplane.controller.{f}" for f in CONTROLLER_FEATURES if f != "node"),
    ),
    Forbidden(
        "the MIG offer never imports steering", ("gpuplane.controller.migoffer",), ("gpuplane.controller.steer",)
    ),
    Forbidden("gangs never import the claim review", ("gpuplane.controller.gang",), ("gpuplane.controller.claim",)),
    Forbidden(
        "the runtime and the controller's base modules import no feature",
        tuple(f"gpuplane.controller.{m}" for m in CONTROLLER_BASE),
        tuple(f"gpuplane.controller.{f}" for f in (*CONTROLLER_FEATURES, "fleet_gauges")),
    ),
    Layers(
        "the driver's layers",
        "gpuplane.driver",
        ("main", "plugin", "observe", "publish", "prepare", "sharing", "inventory", "hw"),
    ),
    Layers(
        "placement's layers",
        "gpuplane.placement",
        ("preference", "queue", "place", "policies", "fragmentation", "snapshot", "model | geometry"),
    ),
)


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to a dotted module name."""

    module: str  # the importing module
    target: str  # what it imports (a module, or ``package.name`` for ``from package import name``)
    path: Path
    line: int


def module_name(path: Path, root: Path) -> str:
    """``root/gpuplane/driver/main.py`` -> ``gpuplane.driver.main`` (``__init__`` -> the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> Iterator[Import]:
    """Every import in ``path``, relative ones resolved."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield Import(module, f"{base}.{alias.name}" if alias.name != "*" else base, path, node.lineno)


def _under(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _layer(name: str, container: str, layers: Sequence[str]) -> int | None:
    if not name.startswith(container + "."):
        return None
    first = name[len(container) + 1 :].split(".", maxsplit=1)[0]
    for index, layer in enumerate(layers):
        if first in (part.strip() for part in layer.split("|")):
            return index
    return None


def broken(contract: Contract, found: Sequence[Import], root: Path) -> list[str]:
    """Every import that breaks ``contract`` (empty: kept)."""
    out = []
    for imp in found:
        if isinstance(contract, Forbidden):
            bad = _under(imp.module, contract.source) and _under(imp.target, contract.forbidden)
        else:
            mine = _layer(imp.module, contract.container, contract.layers)
            theirs = _layer(imp.target, contract.container, contract.layers)
            bad = mine is not None and theirs is not None and theirs < mine
        if bad:
            out.append(f"{imp.path.relative_to(root)}:{imp.line}: {imp.module} imports {imp.target}")
    return out


def all_imports(root: Path) -> list[Import]:
    """The imports of every module of ``root/gpuplane`` (generated protobuf code excluded)."""
    return [
        imp
        for path in sorted((root / "gpuplane").rglob("*.py"))
        if "_proto" not in path.parts
        for imp in imports_of(path, root)
    ]


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.name for c in CONTRACTS])
def test_contract_is_kept(contract: Contract) -> None:
    found = all_imports(REPO)
    assert len(found) > 500, "the walk found too few imports to be checking anything"
    problems = broken(contract, found, REPO)
    assert problems == [], f"{contract.name}: broken by\n" + "\n".join(problems)


def test_every_layer_exists() -> None:
    """A layer renamed away must not leave a contract that silently checks nothing."""
    for contract in CONTRACTS:
        if isinstance(contract, Layers):
            base = REPO.joinpath(*contract.container.split("."))
            for layer in contract.layers:
                for part in (p.strip() for p in layer.split("|")):
                    assert (base / part).is_dir() or (base / f"{part}.py").is_file(), (contract.name, part)
        else:
            for name in contract.source:
                assert (REPO.joinpath(*name.split("."))).exists() or REPO.joinpath(*name.split(".")).with_suffix(
                    ".py"
                ).is_file(), (contract.name, name)


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp


def test_a_wrong_import_is_reported(tmp_path: Path) -> None:
    """The checker on a tree with one deliberately wrong import of each kind, relative and inside a function."""
    root = _tree(
        tmp_path,
        {
            "gpuplane/__init__.py": "",
            "gpuplane/driver/__init__.py": "",
            "gpuplane/driver/main.py": "from gpuplane.driver.hw import sim\n",
            "gpuplane/driver/hw/__init__.py": "",
            "gpuplane/driver/hw/sim.py": "def f():\n    from ..plugin import server\n    return server\n",
            "gpuplane/driver/plugin/__init__.py": "",
            "gpuplane/driver/plugin/server.py": "import gpuplane.controller.kube\n",
            "gpuplane/controller/__init__.py": "",
            "gpuplane/controller/kube.py": "from gpuplane.api import names\n",
            "gpuplane/api/__init__.py": "",
            "gpuplane/api/names.py": "",
        },
    )
    found = all_imports(root)
    by_name = {c.name: broken(c, found, root) for c in CONTRACTS}
    assert by_name["the driver never imports the controller"] == [
        "gpuplane/driver/plugin/server.py:1: gpuplane.driver.plugin.server imports gpuplane.controller.kube"
    ]
    assert by_name["the driver's layers"] == [
        "gpuplane/driver/hw/sim.py:2: gpuplane.driver.hw.sim imports gpuplane.driver.plugin.server"
    ]
    assert by_name["the controller never imports the driver"] == []
    assert by_name["the shared layers import neither program"] == []


def test_the_runtime_importing_a_feature_is_reported(tmp_path: Path) -> None:
    """Issue 34: the memo every feature takes imports none of them (a feature's state is reached by its type)."""
    root = _tree(
        tmp_path,
        {
            "gpuplane/__init__.py": "",
            "gpuplane/controller/__init__.py": "",
            "gpuplane/controller/runtime.py": "from gpuplane.controller.gang import run\n",
            "gpuplane/controller/gang/__init__.py": "",
            "gpuplane/controller/gang/run.py": "from gpuplane.controller import runtime\n",
        },
    )
    got = broken(_contract("the runtime and the controller's base modules import no feature"), all_imports(root), root)
    assert got == ["gpuplane/controller/runtime.py:1: gpuplane.controller.runtime imports gpuplane.controller.gang.run"]


def _contract(name: str) -> Contract:
    return next(c for c in CONTRACTS if c.name == name)


def private_imports(found: Sequence[Import], root: Path) -> list[str]:
    """Every import of a private module or name of a dependency (``kopf._core...``, ``from x import _y``)."""
    out = []
    for imp in found:
        parts = imp.target.split(".")
        if parts[0] in ("gpuplane", "__future__", *SUPPORT_TREES):  # first-party: its own business
            continue
        if any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts):
            out.append(f"{imp.path.relative_to(root)}:{imp.line}: {imp.module} imports {imp.target}")
    return out


SUPPORT_TREES = ("tests", "testing", "e2e", "bench", "scripts")
SUPPORT_CONTRACTS = (
    Forbidden(
        "the benchmarks, the harness and the shared builders never import the tests",
        ("bench", "e2e", "testing"),
        ("tests",),
    ),
)


def support_imports(root: Path) -> list[Import]:
    """The imports of the repository's other Python trees: tests, e2e, benchmarks, scripts."""
    return [
        imp
        for tree in SUPPORT_TREES
        if (root / tree).is_dir()
        for path in sorted((root / tree).rglob("*.py"))
        for imp in imports_of(path, root)
    ]


@pytest.mark.parametrize("contract", SUPPORT_CONTRACTS, ids=[c.name for c in SUPPORT_CONTRACTS])
def test_support_contract_is_kept(contract: Contract) -> None:
    """Issue 34: no bench <-> tests cycle; what both use lives in ``testing/``."""
    found = support_imports(REPO)
    assert any(imp.module.startswith("bench.") and imp.target.startswith("testing.") for imp in found)
    problems = broken(contract, found, REPO)
    assert problems == [], f"{contract.name}: broken by\n" + "\n".join(problems)


def test_no_private_module_of_a_dependency_is_imported() -> None:
    """Issue 34: built on kopf's public API; no ``kopf._...`` (nor any dependency's) import, in the package or
    in the code that tests, benchmarks and deploys it (a test on a private module breaks on the next release
    as surely as the controller would)."""
    found = all_imports(REPO) + support_imports(REPO)
    assert len({imp.path.parts[len(REPO.parts)] for imp in found}) >= 4, "the walk missed a tree"
    assert private_imports(found, REPO) == []


def test_a_private_import_is_reported(tmp_path: Path) -> None:
    """The check on a tree that imports kopf's internals two ways, and gpuplane's own private module (allowed)."""
    root = _tree(
        tmp_path,
        {
            "gpuplane/__init__.py": "",
            "gpuplane/a.py": "from kopf._cogs.clients import api\nimport gpuplane.driver._proto\n",
            "gpuplane/b.py": "def f():\n    from kopf import _core\n    return _core\n",
            "tests/unit/test_c.py": "from kopf._core.engines import probing\n",
        },
    )
    assert private_imports(all_imports(root) + support_imports(root), root) == [
        "gpuplane/a.py:1: gpuplane.a imports kopf._cogs.clients.api",
        "gpuplane/b.py:2: gpuplane.b imports kopf._core",
        "tests/unit/test_c.py:1: tests.unit.test_c imports kopf._core.engines.probing",
    ]
