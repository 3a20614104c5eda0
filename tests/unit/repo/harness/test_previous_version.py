"""N-1's tree: exported from a commit of a real git repository with git archive, once; clear errors otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e.images import previous


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


@pytest.fixture(name="repo")
def repo_fixture(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "Dockerfile.driver").write_text("FROM base\n# v1\n")
    (repo / "gpuplane").mkdir()
    (repo / "gpuplane" / "x.py").write_text("V = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "v1")
    (repo / "Dockerfile.driver").write_text("FROM base\n# v2\n")
    (repo / "untracked.txt").write_text("not committed")
    _git(repo, "commit", "-qam", "v2")
    return repo


def test_export_is_the_commit_not_the_working_tree(repo: Path, tmp_path: Path) -> None:
    first = _git(repo, "rev-list", "--max-parents=0", "HEAD")
    lines: list[str] = []
    tree = previous.export_tree(repo, first[:10], tmp_path / "cache", lines.append)
    assert tree == tmp_path / "cache" / "trees" / first
    assert (tree / "Dockerfile.driver").read_text() == "FROM base\n# v1\n"
    assert (tree / "gpuplane" / "x.py").read_text() == "V = 1\n"
    assert not (tree / "untracked.txt").exists()
    assert lines == [f"exported {first[:12]} to {tree}"]
    # Once exported, the tree is reused (a marker says the export finished).
    (tree / "gpuplane" / "x.py").write_text("touched")
    again: list[str] = []
    assert previous.export_tree(repo, first, tmp_path / "cache", again.append) == tree
    assert again == [] and (tree / "gpuplane" / "x.py").read_text() == "touched"


def test_half_done_export_is_redone(repo: Path, tmp_path: Path) -> None:
    first = _git(repo, "rev-list", "--max-parents=0", "HEAD")
    half = tmp_path / "cache" / "trees" / first
    half.mkdir(parents=True)
    (half / "leftover").write_text("x")
    tree = previous.export_tree(repo, first, tmp_path / "cache", lambda _: None)
    assert not (tree / "leftover").exists() and (tree / "Dockerfile.driver").is_file()


def test_unknown_commit_says_what_to_do(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(previous.PreviousVersionError, match=r"is not in .*fetch the branch that holds it"):
        previous.export_tree(repo, "0" * 40, tmp_path / "cache", lambda _: None)
    assert not (tmp_path / "cache" / "trees").exists()


def test_not_a_repository(tmp_path: Path) -> None:
    with pytest.raises(previous.PreviousVersionError, match="upgrade test installs it as N-1"):
        previous.resolve_commit(tmp_path, "HEAD")
