"""The controller's on-demand memory report (SIGUSR2)."""

from __future__ import annotations

import os
import re
import signal
import time
import tracemalloc
from pathlib import Path

import pytest

from gpuplane.controller import memdump


class Marker:
    """A type only this test creates, so its row can be found."""


def test_type_table_counts_and_sizes_by_type() -> None:
    objs = [Marker() for _ in range(7)] + [[1], [2]]
    rows = memdump.type_table(objs, top=5)
    marker = next(r for r in rows if r.endswith("test_memdump.Marker"))
    assert marker.split()[0] == "7"
    lists = next(r for r in rows if r.endswith("builtins.list"))
    assert lists.split()[0] == "2"


def test_dict_shapes_name_dicts_by_their_keys() -> None:
    bodies = [{"metadata": {}, "spec": [], "kind": "Pod"} for _ in range(5)]
    wide = {f"k{i}": [i] for i in range(12)}
    rows = memdump.dict_shapes([*bodies, wide, {}, {1: "a"}, "not a dict"], top=10)
    assert rows[0].split()[0] == "5" and rows[0].endswith("{kind, metadata, spec}")
    assert any(r.endswith("{12 keys: k0, k1, k2, ...}") for r in rows)
    assert any(r.endswith("{(empty)}") for r in rows) and any(r.endswith("{int}") for r in rows)
    assert len(rows) == 4  # the string is not a dict


def test_malloc_rows_say_what_the_allocator_holds_and_what_a_trim_returns() -> None:
    if memdump._glibc() is None:
        pytest.skip("not glibc 2.33+")
    blocks = [bytes(20000) for _ in range(4000)]  # 80 MB from malloc (above pymalloc's 512-byte limit)
    del blocks[::2]  # half freed, in holes of whole pages the heap keeps until trimmed
    rows = memdump.malloc_rows()
    del blocks
    figures = re.match(r"C allocator .* heap ([0-9.]+) MB .*, ([0-9.]+) MB in use, ([0-9.]+) MB free but held", rows[0])
    assert figures, rows[0]
    heap, in_use, free = (float(x) for x in figures.groups())
    assert in_use >= 30.0 and free >= 30.0 and heap >= in_use
    trimmed = re.match(r"malloc_trim\(0\): RSS ([0-9.]+) -> ([0-9.]+) MB", rows[1])
    assert trimmed, rows[1]
    assert float(trimmed.group(1)) - float(trimmed.group(2)) >= 20.0  # the freed holes went back


def test_pymalloc_rows_see_small_objects_held_in_arenas_and_leave_stderr_as_it_was() -> None:
    def allocated_mb() -> float:
        row = next(r for r in memdump.pymalloc_rows() if "bytes in allocated blocks" in r)
        return int(row.rsplit("=", 1)[1].strip().replace(",", "")) / 1e6

    before = allocated_mb()
    small = [(i, str(i)) for i in range(200_000)]  # ~25 MB of objects under pymalloc's 512-byte limit
    during = allocated_mb()
    del small
    assert during - before >= 15.0
    assert any("arenas allocated current" in r for r in memdump.pymalloc_rows())
    os.write(2, b"")  # file descriptor 2 is usable again (restored after the call)
    assert os.fstat(2) is not None


def test_report_without_tracing_says_how_to_get_sites() -> None:
    was = tracemalloc.is_tracing()
    if was:
        tracemalloc.stop()
    try:
        text = memdump.report()
    finally:
        if was:
            tracemalloc.start()
    assert text.splitlines()[1].startswith("RSS ")
    assert text.splitlines()[2].startswith("C allocator")
    assert "Python's small-object allocator (pymalloc):" in text
    assert "## live objects by type" in text
    assert "PYTHONTRACEMALLOC" in text


def test_report_with_tracing_names_the_allocating_line() -> None:
    was = tracemalloc.is_tracing()
    tracemalloc.start(3)
    try:
        hoard = [bytearray(64 * 1024) for _ in range(64)]  # 4 MB from this line
        text = memdump.report()
        del hoard
    finally:
        if not was:
            tracemalloc.stop()
    by_line = text.split("## allocated at (by line)")[1].split("## allocated at (by call path")[0]
    first = by_line.strip().splitlines()[0]
    assert "test_memdump.py" in first
    assert float(first.split()[0]) >= 4.0


def test_sigusr2_writes_the_report(tmp_path: Path) -> None:
    old = signal.getsignal(signal.SIGUSR2)
    try:
        memdump.install(tmp_path)
        os.kill(os.getpid(), signal.SIGUSR2)
        path = tmp_path / f"gpuplane-controller-memory-{os.getpid()}.txt"
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert path.read_text().startswith(f"# gpuplane-controller memory, pid {os.getpid()}")
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_an_unwritable_directory_still_logs_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logged: list[tuple[str, dict[str, object]]] = []

    class Log:
        def info(self, event: str, **kw: object) -> None:
            logged.append((event, kw))

        def warning(self, event: str, **kw: object) -> None:
            logged.append((event, kw))

    monkeypatch.setattr(memdump, "log", Log())
    old = signal.getsignal(signal.SIGUSR2)
    missing = tmp_path / "gone"
    try:
        memdump.install(missing)  # the directory does not exist (a read-only root): the process lives
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not any(e == "memory report" for e, _ in logged) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGUSR2, old)
    assert not missing.exists()
    report = dict(logged)["memory report"]
    assert report["path"] is None and str(report["report"]).startswith("# gpuplane-controller memory")


def test_install_needs_no_writable_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Deployment's root file system is read-only: tempfile finds no directory, and the controller
    must still start (the first image run on a real node crashed here), the report going to the log."""

    def none_usable() -> str:
        raise FileNotFoundError(2, "No usable temporary directory found")

    monkeypatch.setattr(memdump.tempfile, "gettempdir", none_usable)
    old = signal.getsignal(signal.SIGUSR2)
    try:
        memdump.install()
        assert memdump._default_directory() is None
    finally:
        signal.signal(signal.SIGUSR2, old)
