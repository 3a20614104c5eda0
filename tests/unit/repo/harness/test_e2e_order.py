"""The e2e modules that install the base manifests on the session's control plane run before its gpu_cluster.

The base install's controller Deployment (two replicas, no nodeSelector) would otherwise put pods on the
session's simulated nodes, which test_scenarios checks hold none (a full CI run failed on exactly this,
twice, for two different modules). This reads the modules' source, so a new module is caught before CI.
"""

import re
from pathlib import Path

from tests.e2e.conftest import OWN_PLANE_MODULES

E2E = Path(__file__).resolve().parents[3] / "e2e"
# Installing it directly, or through tests/rbackit's ``installed`` fixture (which does the same).
BASE_INSTALL = re.compile(r"install\.apply\(\s*control_plane\b|\binstalled_fixture\b")


def base_installers(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("test_*.py") if BASE_INSTALL.search(p.read_text())}


def test_every_module_installing_the_base_on_the_session_plane_runs_before_gpu_cluster() -> None:
    installers = base_installers(E2E)
    assert "test_manifests.py" in installers  # the scan finds what it looks for
    assert installers <= set(OWN_PLANE_MODULES), sorted(installers - set(OWN_PLANE_MODULES))


def test_the_scan_flags_a_module_that_is_not_listed(tmp_path: Path) -> None:
    (tmp_path / "test_new.py").write_text("def node(control_plane):\n    install.apply(control_plane)\n")
    (tmp_path / "test_other.py").write_text("def node(fresh):\n    install.apply(fresh)\n")
    (tmp_path / "test_kit.py").write_text("from tests.rbackit import installed_fixture  # noqa: F401\n")
    assert base_installers(tmp_path) == {"test_new.py", "test_kit.py"}
