"""An install of a version older than the real-node fixes: which commits need it, and the patches it gets."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from e2e.plane import realinstall, realinstall_compat
from tests.unit.repo.harness.test_realinstall import FakeNode, _nodes


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_commits_before_the_fix_need_the_patches(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    commits = []
    for n in range(3):
        (tmp_path / "f").write_text(str(n))
        _git(tmp_path, "add", "f")
        _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{n}")
        commits.append(_git(tmp_path, "rev-parse", "HEAD"))
    old, fixed, new = commits
    assert realinstall_compat.needs_compat(tmp_path, old, fixed_in=fixed)
    assert not realinstall_compat.needs_compat(tmp_path, fixed, fixed_in=fixed)
    assert not realinstall_compat.needs_compat(tmp_path, new, fixed_in=fixed)
    with pytest.raises(RuntimeError, match="git merge-base"):
        realinstall_compat.needs_compat(tmp_path, "0" * 40, fixed_in=fixed)


def _rendered(layout: realinstall.Layout) -> str:
    link = f"{layout.nodes_root}/$(NODE_NAME)/kubelet"
    daemonset = {
        "kind": "DaemonSet",
        "metadata": {"name": "gpuplane-driver"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "args": [
                                "--backend=sim",
                                f"--registry-dir={link}/plugins_registry",
                                f"--plugin-dir={link}/plugins/gpu.gpuplane.dev",
                                f"--cdi-root={layout.nodes_root}/$(NODE_NAME)/cdi",
                            ]
                        }
                    ]
                }
            }
        },
    }
    return yaml.safe_dump_all([{"kind": "Namespace", "metadata": {"name": "x"}}, daemonset])


def test_patches_give_the_probe_the_identity_and_the_short_socket_dirs(tmp_path: Path) -> None:
    node = _nodes(tmp_path)[0]
    layout = realinstall.Layout(tmp_path / "realnodes", tmp_path / "rn")
    driver, controller = realinstall_compat.patches(_rendered(layout), layout, [node])
    assert driver["target"] == {"kind": "DaemonSet", "name": "gpuplane-driver"}
    probe, args = yaml.safe_load(driver["patch"])
    assert probe["path"].endswith("/startupProbe") and probe["value"]["failureThreshold"] == 30
    short = node.kubelet_root.resolve()
    assert args["op"] == "replace" and args["value"] == [
        "--backend=sim",
        f"--registry-dir={short}/plugins_registry",
        f"--plugin-dir={short}/plugins/gpu.gpuplane.dev",
        f"--cdi-root={tmp_path}/realnodes/$(NODE_NAME)/cdi",  # not a socket dir: left as the overlay has it
    ]
    assert controller["target"] == {"kind": "Deployment", "name": "gpuplane-controller"}
    (env,) = yaml.safe_load(controller["patch"])
    assert env["value"] == {"name": "LOGNAME", "value": "gpuplane-controller"}
    # The generated kustomization carries them after its own patch.
    k = realinstall.kustomization(layout, {}, [driver, controller])
    assert k["patches"][1:] == [driver, controller]


def test_patches_refuse_more_than_one_node_or_no_daemonset(tmp_path: Path) -> None:
    nodes: list[FakeNode] = _nodes(tmp_path)
    layout = realinstall.Layout(tmp_path / "realnodes", tmp_path / "rn")
    with pytest.raises(ValueError, match="one real node only"):
        realinstall_compat.patches(_rendered(layout), layout, list(nodes))
    with pytest.raises(ValueError, match="no driver DaemonSet"):
        realinstall_compat.patches("kind: Namespace\n", layout, nodes[:1])
