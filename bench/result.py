"""One benchmark run's result file: what ran, where, when, how it ended, and every line it printed.

``python -m bench NAME [ARGS...]`` writes one per run into ``--results DIR`` (default ``bench-results/``
in the working directory), named ``NAME-<start, UTC>-<pid>.json``: a JSON object with

- ``format``: :data:`FORMAT` (a reader refuses other formats);
- ``bench``: the benchmark's name, ``argv``: the arguments it was given;
- ``commit``: ``git rev-parse HEAD`` of the checkout the benchmarks run from, or null outside one;
- ``cpus``: the host's CPU count (``os.cpu_count()``);
- ``kubernetes``: the Kubernetes release the run was given (``GPUPLANE_KUBERNETES``), or null;
- ``started``, ``ended``: UTC times in ISO 8601;
- ``exit_code``: what the benchmark returned or exited with (1 when it raised);
- ``lines``: what it printed on standard output, one string per line.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

FORMAT = 1
REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Result:
    """One run; :func:`write` stores it, :func:`read` gives it back equal."""

    bench: str
    argv: tuple[str, ...]
    commit: str | None
    cpus: int
    kubernetes: str | None
    started: str
    ended: str
    exit_code: int
    lines: tuple[str, ...]


def now() -> str:
    """The current UTC time in ISO 8601 (``2026-12-05T10:11:12.345678+00:00``)."""
    return datetime.datetime.now(datetime.UTC).isoformat()


def commit(repo: Path = REPO) -> str | None:
    """``git rev-parse HEAD`` in ``repo``; None without git or outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def kubernetes(env: dict[str, str] | None = None) -> str | None:
    """The Kubernetes release a run was given (``GPUPLANE_KUBERNETES``, as ``e2e`` reads it), or None."""
    return (os.environ if env is None else env).get("GPUPLANE_KUBERNETES") or None


def path_for(result: Result, directory: Path) -> Path:
    """Where :func:`write` puts ``result``: ``NAME-<start as 20261205T101112Z>-<pid>.json``."""
    start = datetime.datetime.fromisoformat(result.started).astimezone(datetime.UTC)
    return directory / f"{result.bench}-{start:%Y%m%dT%H%M%SZ}-{os.getpid()}.json"


def write(result: Result, directory: Path) -> Path:
    """Store ``result`` as JSON in ``directory`` (created if missing); the file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = path_for(result, directory)
    body = {"format": FORMAT, **dataclasses.asdict(result)}
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def _typed(body: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"result field {key!r}: expected {kind}, got {value!r}")
    return value


def _strings(body: dict[str, Any], key: str) -> tuple[str, ...]:
    value = _typed(body, key, list)
    if not all(isinstance(item, str) for item in value):
        raise ValueError(f"result field {key!r}: expected a list of strings")
    return tuple(value)


def read(path: Path) -> Result:
    """The result stored at ``path``; ValueError when it is not a result file of :data:`FORMAT`."""
    body = json.loads(path.read_text())
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"{path}: not a bench result of format {FORMAT}")
    return Result(
        bench=_typed(body, "bench", str),
        argv=_strings(body, "argv"),
        commit=_typed(body, "commit", (str, type(None))),
        cpus=_typed(body, "cpus", int),
        kubernetes=_typed(body, "kubernetes", (str, type(None))),
        started=_typed(body, "started", str),
        ended=_typed(body, "ended", str),
        exit_code=_typed(body, "exit_code", int),
        lines=_strings(body, "lines"),
    )
