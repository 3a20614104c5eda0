"""``python -m bench``: the listing by subject, dispatch to a benchmark's ``main``, and its result file."""

from __future__ import annotations

import datetime
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import __main__ as entry
from bench import result

REPO = Path(__file__).resolve().parents[4]
FAKE = '''"""A fake benchmark: prints its argv, then ends as its first argument says."""

import sys


def main(argv):
    print("fake: started")
    print("argv:", " ".join(argv))
    sys.stdout.write("no newline at the end")
    if argv and argv[0] == "exit":
        raise SystemExit(int(argv[1]))
    if argv and argv[0] == "raise":
        raise RuntimeError("the fake broke")
    return 3
'''


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, list[entry.Bench]]]:
    """A catalogue of one benchmark, ``fake``, in a module of its own under ``tmp_path``."""
    (tmp_path / "fakebench_pkg").mkdir()
    (tmp_path / "fakebench_pkg" / "__init__.py").write_text("")
    (tmp_path / "fakebench_pkg" / "fake.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return [("tests", "Fakes.", [entry.Bench("fake", "fakebench_pkg.fake", "tests", "A fake benchmark.")])]


def _only_result(directory: Path) -> result.Result:
    files = sorted(directory.glob("*.json"))
    assert len(files) == 1, files
    return result.read(files[0])


def test_the_catalogue_has_every_runnable_module_by_subject_and_no_other() -> None:
    subjects = entry.catalogue()
    by_name = {b.name: b for _, _, benches in subjects for b in benches}
    assert [s for s, _, _ in subjects] == ["dra", "driver", "fleet", "gangs", "kube", "placement", "rightsize"]
    runnable = {
        p.stem for p in (REPO / "bench").glob("*/*.py") if "\ndef main(" in p.read_text() and not p.name.startswith("_")
    }
    assert set(by_name) == runnable
    assert {"placement_bench", "frag_bound", "fleet_scale", "driver_bench", "gang_domains"} <= runnable
    assert "trace" not in by_name and "driver_harness" not in by_name  # helpers, not benchmarks
    assert by_name["frag_bound"].module == "bench.placement.frag_bound"
    assert by_name["fleet_scale"].subject == "fleet"
    assert by_name["frag_bound"].summary.startswith("How far each policy is from the best packing")
    for bench in by_name.values():  # every listed module imports under its name and has a main
        assert callable(importlib.import_module(bench.module).main), bench.module


def test_list_and_no_arguments_print_the_subjects_with_one_line_per_benchmark(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert entry.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert entry.main([]) == 0
    assert capsys.readouterr().out == listed
    lines = listed.splitlines()
    assert "placement: Placement on the Alibaba GPU trace" in "\n".join(lines)
    frag = next(line for line in lines if line.split()[:1] == ["frag_bound"])
    assert "lower bound on fragmentation" in frag
    placement_at = next(i for i, line in enumerate(lines) if line.startswith("placement:"))
    assert lines.index(frag) > placement_at  # listed under its subject
    assert sum(1 for line in lines if line.startswith("  ")) == sum(len(b) for _, _, b in entry.catalogue())


def test_a_run_prints_live_and_writes_one_result_file_that_reads_back(
    fake: list[tuple[str, str, list[entry.Bench]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUPLANE_KUBERNETES", "1.36")
    before = datetime.datetime.now(datetime.UTC)
    code = entry.main(["--results", str(tmp_path / "out"), "fake", "--quick", "x y"], subjects=fake)
    assert code == 3
    printed = capsys.readouterr()
    assert printed.out == "fake: started\nargv: --quick x y\nno newline at the end"
    assert "bench: result in" in printed.err
    got = _only_result(tmp_path / "out")
    assert got.bench == "fake"
    assert got.argv == ("--quick", "x y")
    assert got.exit_code == 3
    assert got.lines == ("fake: started", "argv: --quick x y", "no newline at the end")
    assert got.cpus == os.cpu_count()
    assert got.kubernetes == "1.36"
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    assert got.commit == (git.stdout.strip() if git.returncode == 0 else None)
    started, ended = (datetime.datetime.fromisoformat(t) for t in (got.started, got.ended))
    assert started.utcoffset() == datetime.timedelta(0) and ended.utcoffset() == datetime.timedelta(0)
    assert before <= started <= ended <= datetime.datetime.now(datetime.UTC)
    assert sys.stdout is not None and not isinstance(sys.stdout, entry.Tee)  # restored


def test_an_exit_and_an_exception_are_recorded_too(
    fake: list[tuple[str, str, list[entry.Bench]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUPLANE_KUBERNETES", raising=False)
    assert entry.main(["--results", str(tmp_path / "exit"), "fake", "exit", "4"], subjects=fake) == 4
    exited = _only_result(tmp_path / "exit")
    assert exited.exit_code == 4 and exited.kubernetes is None
    with pytest.raises(RuntimeError, match="the fake broke"):
        entry.main(["--results", str(tmp_path / "raise"), "fake", "raise"], subjects=fake)
    raised = _only_result(tmp_path / "raise")
    assert raised.exit_code == 1
    assert raised.lines == ("fake: started", "argv: raise", "no newline at the end")


def test_an_unknown_name_exits_2_naming_every_benchmark_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert entry.main(["--results", str(tmp_path / "out"), "placement_bnech", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark 'placement_bnech'" in err
    for _, _, benches in entry.catalogue():
        for bench in benches:
            assert bench.name in err
    assert not (tmp_path / "out").exists()


def test_the_result_format_round_trips_and_refuses_other_files(tmp_path: Path) -> None:
    run = result.Result(
        bench="frag_bound",
        argv=("default", "hgx", "1.2"),
        commit=None,
        cpus=2,
        kubernetes=None,
        started="2026-12-05T10:11:12.000001+00:00",
        ended="2026-12-05T10:12:00+00:00",
        exit_code=0,
        lines=("a", ""),
    )
    path = result.write(run, tmp_path / "new")
    assert path.parent == tmp_path / "new" and path.name.startswith("frag_bound-20261205T101112Z-")
    assert result.read(path) == run
    assert json.loads(path.read_text())["format"] == result.FORMAT
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, "format": 99}))
    with pytest.raises(ValueError, match="not a bench result"):
        result.read(path)
    path.write_text(json.dumps({**body, "exit_code": "0"}))
    with pytest.raises(ValueError, match="exit_code"):
        result.read(path)


def test_the_command_line_runs_a_real_benchmark_and_the_module_still_runs_alone(tmp_path: Path) -> None:
    """``python -m bench frag_bound --help`` through the entry point (a result), and the module directly (none)."""
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--results", str(out), "frag_bound", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: python -m bench frag_bound")
    got = _only_result(out)
    assert (got.bench, got.argv, got.exit_code) == ("frag_bound", ("--help",), 0)
    assert got.lines == tuple(run.stdout.splitlines())
    alone = subprocess.run(
        [sys.executable, "-m", "bench.placement.frag_bound", "--help"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.startswith("usage: frag_bound.py")
    assert not (tmp_path / "bench-results").exists()


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("bench.placement.trace", "REPO"),
        ("bench.kube.kube_compare", "REPO"),
        ("bench.driver.driver_harness", "REPO"),
        ("bench.dra.dra_overhead", "REPO_ROOT"),
        ("bench.fleet.fleet_scale", "REPO_ROOT"),
        ("bench.fleet.fleet_before", "REPO_ROOT"),
        ("bench.fleet.controller_memory", "REPO_ROOT"),
        ("bench.result", "REPO"),
    ],
)
def test_paths_to_the_repository_survive_the_move_into_subject_packages(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) == REPO


def test_the_newer_scheduler_sources_are_found_from_its_subject_package() -> None:
    from bench.fleet import newer_scheduler

    assert newer_scheduler.MODULE_DIR == REPO / "e2e" / "cluster" / "schedbuild"
    assert newer_scheduler.MODULE_DIR.is_dir()
