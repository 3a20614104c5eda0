"""bench.docs_results: a benchmark's --write-docs keeps the prose above the marker and replaces what follows."""

from pathlib import Path

from bench import docs_results


def test_write_keeps_the_prose_and_replaces_old_results(tmp_path: Path) -> None:
    doc = tmp_path / "placement.md"
    doc.write_text(f"# Placement\n\nprose kept\n\n{docs_results.MARKER}\n\n```text\nold run\n```\n")
    docs_results.write(doc, "Placement", ["new run", "2/2 targets met"])
    assert doc.read_text() == (
        f"# Placement\n\nprose kept\n\n{docs_results.MARKER}\n\n```text\nnew run\n2/2 targets met\n```\n"
    )


def test_write_creates_a_missing_document_with_its_title(tmp_path: Path) -> None:
    doc = tmp_path / "rightsizing.md"
    docs_results.write(doc, "Right-sizing", ["a"])
    assert doc.read_text() == f"# Right-sizing\n\n{docs_results.MARKER}\n\n```text\na\n```\n"
