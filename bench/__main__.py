"""``python -m bench``: the benchmarks by subject, or one run with its result recorded.

    python -m bench [list]                          every runnable benchmark by subject, one line each
    python -m bench [--results DIR] NAME [ARGS...]  NAME's ``main(ARGS)``, its result file in DIR

A benchmark is a module of a subject package (``bench/<subject>/<name>.py``) with a top-level
``main(argv)`` returning its exit code; its line in the list is its docstring's first paragraph. The
catalogue is read from the source (no benchmark is imported to list them). A run prints live as before,
and its result (:mod:`bench.result`) goes to ``DIR`` (default ``bench-results/``). ``python -m
bench.<subject>.<name>`` still runs a module directly, without a result file.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import io
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO, cast

from bench import result

HERE = Path(__file__).resolve().parent
DEFAULT_RESULTS = Path("bench-results")


@dataclasses.dataclass(frozen=True)
class Bench:
    """One runnable benchmark: its name, the module whose ``main`` runs it, its subject and summary."""

    name: str
    module: str
    subject: str
    summary: str


def _docstring(path: Path) -> tuple[str, ast.Module]:
    tree = ast.parse(path.read_text(), str(path))
    return ast.get_docstring(tree) or "", tree


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n", maxsplit=1)[0].split())


def catalogue(root: Path = HERE) -> list[tuple[str, str, list[Bench]]]:
    """``(subject, its summary, its benchmarks)`` for every subject package under ``root``, by name."""
    out = []
    for init in sorted(root.glob("*/__init__.py")):
        package = init.parent
        benches = []
        for path in sorted(package.glob("*.py")):
            if path.name.startswith("_"):
                continue
            doc, tree = _docstring(path)
            if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
                module = f"{root.name}.{package.name}.{path.stem}"
                benches.append(Bench(path.stem, module, package.name, _first_paragraph(doc)))
        if benches:
            out.append((package.name, _first_paragraph(_docstring(init)[0]), benches))
    return out


def listing(subjects: Sequence[tuple[str, str, list[Bench]]]) -> str:
    """The text of ``python -m bench list``."""
    width = max((len(b.name) for _, _, benches in subjects for b in benches), default=0) + 2
    lines = ["Benchmarks: python -m bench [--results DIR] NAME [ARGS...] (NAME --help for its options)."]
    for subject, summary, benches in subjects:
        lines += ["", f"{subject}: {summary}"]
        lines += [f"  {b.name:<{width}}{b.summary}" for b in benches]
    return "\n".join(lines)


class Tee(io.TextIOBase):
    """Standard output that still prints live and keeps a copy of everything written."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.out.write(text)
        self.kept.write(text)
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return self.out.isatty()

    def fileno(self) -> int:
        return self.out.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.out.encoding

    def lines(self) -> tuple[str, ...]:
        return tuple(self.kept.getvalue().splitlines())


def exit_code(exc: SystemExit) -> int:
    """The status Python would exit with for ``exc`` (a message means 1, and is printed on stderr)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def run(bench: Bench, argv: Sequence[str], results: Path) -> tuple[int, Path]:
    """Run ``bench`` with ``argv``, standard output teed; its exit code and the result file written."""
    entry: Callable[[list[str]], int | None] = importlib.import_module(bench.module).main
    started = result.now()
    tee = Tee(sys.stdout)
    code = 1
    saved_argv = sys.argv
    try:
        sys.argv = [f"python -m bench {bench.name}", *argv]  # argparse's usage line names the command
        sys.stdout = cast(TextIO, tee)
        try:
            code = entry(list(argv)) or 0
        except SystemExit as exc:
            code = exit_code(exc)
        except KeyboardInterrupt:
            code = 130
            raise
    finally:
        sys.stdout = tee.out
        sys.argv = saved_argv
        tee.flush()
        record = result.Result(
            bench=bench.name,
            argv=tuple(argv),
            commit=result.commit(),
            cpus=os.cpu_count() or 0,
            kubernetes=result.kubernetes(),
            started=started,
            ended=result.now(),
            exit_code=code,
            lines=tee.lines(),
        )
        path = result.write(record, results)
        print(f"bench: result in {path}", file=sys.stderr)
    return code, path


def main(argv: Sequence[str] | None = None, subjects: Sequence[tuple[str, str, list[Bench]]] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench", description=(__doc__ or "").split("\n\n")[0].strip("`"), add_help=True
    )
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="where result files go (%(default)s)")
    p.add_argument("name", nargs="?", default="list", help="a benchmark's name, or list (the default)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    args = p.parse_args(argv)
    subjects = catalogue() if subjects is None else subjects
    if args.name == "list":
        try:
            print(listing(subjects), flush=True)
        except BrokenPipeError:  # ``python -m bench list | head``: the reader left; nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    by_name = {b.name: b for _, _, benches in subjects for b in benches}
    if args.name not in by_name:
        names = ", ".join(sorted(by_name))
        print(f"python -m bench: no benchmark {args.name!r}; the benchmarks: {names}", file=sys.stderr)
        return 2
    code, _ = run(by_name[args.name], args.args, args.results)
    return code


if __name__ == "__main__":
    sys.exit(main())
