#!/usr/bin/env bash
# Create .venv (if missing) and install gpuplane with its dev tools. Sourced by test.sh and demo.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "gpuplane needs Python >= 3.11 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "==> creating virtualenv $ROOT/.venv"
  "$PY" -m venv "$ROOT/.venv"
fi
# shellcheck disable=SC1091
. "$ROOT/.venv/bin/activate"
# The exact versions and hashes of requirements/dev.lock (scripts/lock.sh writes it), then gpuplane
# itself without resolving anything again: CI, the demo and every developer run the same set.
stamp="$ROOT/.venv/.gpuplane-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] || [ "$ROOT/requirements/dev.lock" -nt "$stamp" ]; then
  echo "==> installing gpuplane and dev tools into .venv (requirements/dev.lock)"
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet --require-hashes -r "$ROOT/requirements/dev.lock"
  python -m pip install --quiet --no-deps -e "$ROOT"
  python -m pip check
  touch "$stamp"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "Go >= 1.26 is needed to build the Kubernetes control plane used by the e2e suite and the demo." >&2
  echo "Install it (https://go.dev/doc/install) and re-run." >&2
  exit 1
fi
