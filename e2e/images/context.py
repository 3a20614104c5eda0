"""The cache key of an image: the hash of everything that went into its build.

An image is rebuilt only when its key changes. The key covers the Dockerfile's
bytes, the ``.dockerignore``, every file the Dockerfile's ``COPY``/``ADD``
instructions take from the build context (names, modes and contents, read from
the working tree, so uncommitted edits count), the build arguments, the base
image's id and a recipe revision. Files the ``.dockerignore`` always drops
(``__pycache__``, ``*.pyc``) are skipped here too; anything else under a copied
path is hashed even if the builder would ignore it, so the key can only err on
the side of a rebuild.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path

# Bump when the way images are built changes (builder flags, archive layout).
RECIPE_REVISION = 1
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc",)


class ContextError(ValueError):
    """The Dockerfile names a source that is not in the build context."""


def instructions(dockerfile_text: str) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    pending = ""
    for raw in dockerfile_text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            yield word.upper(), rest.strip()
    if pending.strip():
        word, _, rest = pending.strip().partition(" ")
        yield word.upper(), rest.strip()


def context_sources(dockerfile_text: str) -> list[str]:
    """The build-context paths that COPY/ADD instructions read (not those with ``--from``)."""
    sources: list[str] = []
    for word, rest in instructions(dockerfile_text):
        if word not in ("COPY", "ADD"):
            continue
        tokens = shlex.split(rest)
        flags = [t for t in tokens if t.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [t for t in tokens if not t.startswith("--")]
        sources.extend(paths[:-1])  # the last path is the destination
    return sources


def _files(root: Path, source: str) -> Iterator[Path]:
    path = root / source
    if any(ch in source for ch in "*?["):
        matches = sorted(root.glob(source))
        if not matches:
            raise ContextError(f"COPY source {source!r} matches nothing in {root}")
        for match in matches:
            yield from _files(root, str(match.relative_to(root)))
        return
    if path.is_file():
        yield path
        return
    if not path.is_dir():
        raise ContextError(f"COPY source {source!r} is not in the build context {root}")
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(_SKIP_SUFFIXES):
                yield Path(dirpath) / name


def cache_key(
    dockerfile: Path,
    context: Path,
    *,
    build_args: Mapping[str, str],
    base_image_id: str,
) -> str:
    """The hex sha256 of what goes into building ``dockerfile`` in ``context``."""
    text = dockerfile.read_text()
    digest = hashlib.sha256()

    def feed(*parts: str | bytes) -> None:
        for part in parts:
            data = part.encode() if isinstance(part, str) else part
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)

    feed("recipe", str(RECIPE_REVISION), "dockerfile", text, "base", base_image_id)
    ignore = context / ".dockerignore"
    feed("dockerignore", ignore.read_bytes() if ignore.is_file() else b"")
    for name, value in sorted(build_args.items()):
        feed("arg", name, value)
    seen: set[Path] = set()
    for source in context_sources(text):
        for path in _files(context, source):
            if path in seen:
                continue
            seen.add(path)
            feed("file", str(path.relative_to(context)), oct(path.stat().st_mode & 0o777), path.read_bytes())
    return digest.hexdigest()
