"""An earlier version of gpuplane, exactly as committed: its tree exported from git, its images built from it.

The upgrade tests install version N-1 and roll to N (this working tree) and back. N-1
is a commit of this repository named in the test, never a hand-kept copy:
:func:`export_tree` writes ``git archive <commit>`` into
``<cache>/trees/<commit>/`` (once; a marker file says the export finished), and
:func:`previous_images` builds that tree's own ``Dockerfile.driver`` and
``Dockerfile.controller`` with the same builder and base image as N
(:func:`e2e.images.build.ensure_images`). The images are cached by the hash of what went
in, like N's, so a second run builds nothing. Their pinned names
(``localhost/gpuplane-<x>:<version>-<key>``) differ from N's whenever anything that
went into them differs, so both versions can sit in one containerd side by side.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path

from e2e.cluster import build as k8sbuild
from e2e.images import build

Printer = Callable[[str], None]

PREVIOUS = "6aa6d0316f2d5e4140523349e33a879bc005c519"
"""N-1 of the upgrade tests: the oldest commit of main whose images run on real nodes (the driver's
startupProbe, the controller's kopf identity; both found on the first real-node run). Every earlier
commit's controller crash-loops in its image (kopf's getpass.getuser() has no passwd entry for uid 65532)."""
COMMIT_PATTERN = re.compile(r"^[0-9a-f]{40}$")
DONE_MARKER = ".gpuplane-exported"


class PreviousVersionError(RuntimeError):
    """The earlier commit cannot be exported (unknown commit, shallow clone, not a repository)."""


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=120, check=False)


def resolve_commit(repo: Path, commit: str) -> str:
    """The full hash of ``commit`` in ``repo``; PreviousVersionError with what to do when it is missing."""
    done = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    full = done.stdout.decode().strip()
    if done.returncode != 0 or not COMMIT_PATTERN.match(full):
        shallow = _git(repo, "rev-parse", "--is-shallow-repository").stdout.decode().strip() == "true"
        hint = "this clone is shallow: run `git fetch --unshallow`" if shallow else "fetch the branch that holds it"
        raise PreviousVersionError(f"commit {commit} is not in {repo} ({hint}); the upgrade test installs it as N-1")
    return full


def export_tree(repo: Path, commit: str, cache: Path, out: Printer = print) -> Path:
    """``<cache>/trees/<full hash>/``: the files of ``commit``, exported once with ``git archive``."""
    full = resolve_commit(repo, commit)
    dest = cache / "trees" / full
    if (dest / DONE_MARKER).is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    tar = dest.with_name(f".{full}.tar")
    done = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", f"--output={tar}", full],
        capture_output=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise PreviousVersionError(f"git archive {full} failed: {done.stderr.decode().strip()}")
    try:
        with tarfile.open(tar) as archive:
            archive.extractall(dest, filter="data")
    finally:
        tar.unlink(missing_ok=True)
    (dest / DONE_MARKER).write_text(full + "\n")
    out(f"exported {full[:12]} to {dest}")
    return dest


def previous_images(
    repo: Path,
    commit: str,
    *,
    cache: Path | None = None,
    environ: Mapping[str, str] | None = None,
    out: Printer = print,
) -> tuple[Path, list[build.BuiltImage]]:
    """The exported tree of ``commit`` and its two images, built from its own Dockerfiles."""
    root = cache or k8sbuild.cache_root(dict(os.environ if environ is None else environ))
    tree = export_tree(repo, commit, root, out)
    return tree, build.ensure_images(repo=tree, cache=root, environ=environ, out=out)
