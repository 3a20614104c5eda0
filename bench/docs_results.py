"""Write a benchmark's printed results into its document, below the document's ``<!-- results -->`` marker.

Everything above the marker is prose kept by hand; everything below is replaced by the run's lines in a
text block (``--write-docs`` of placement_bench and rightsize_bench).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

MARKER = "<!-- results -->"


def write(path: Path, title: str, lines: Sequence[str]) -> None:
    """Replace what follows the marker in ``path`` (created with ``# title`` if missing) with ``lines``."""
    text = path.read_text() if path.exists() else f"# {title}\n\n{MARKER}\n"
    head = text.split(MARKER)[0]
    path.write_text(head + MARKER + "\n\n```text\n" + "\n".join(lines) + "\n```\n")
