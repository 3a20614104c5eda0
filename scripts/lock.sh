#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml: requirements/runtime.lock (what the images install)
# and requirements/dev.lock (what .venv and CI install). Exact versions and hashes for every platform
# (--universal: the GB200 driver image is arm64), Python 3.11 as the floor. Run after changing a
# dependency or its bounds in pyproject.toml, then commit both files; scripts/bootstrap.sh reinstalls
# .venv when a lock file is newer than its stamp.
#   scripts/lock.sh            # keep the locked versions where the bounds still allow them
#   scripts/lock.sh --upgrade  # newest versions within pyproject.toml's bounds
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UV_VERSION=0.13.9
tools="${GPUPLANE_CACHE:-$HOME/.cache/gpuplane}/tools/uv-$UV_VERSION"
if [ ! -x "$tools/bin/uv" ]; then
  echo "==> installing uv $UV_VERSION into $tools (PyPI)"
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet "uv==$UV_VERSION"
fi
cd "$ROOT"
for spec in "runtime.lock:" "dev.lock:--extra=dev"; do
  out="requirements/${spec%%:*}"
  extra="${spec#*:}"
  echo "==> $out"
  # shellcheck disable=SC2086
  "$tools/bin/uv" pip compile pyproject.toml $extra --universal --python-version 3.11 --generate-hashes \
    --quiet --custom-compile-command "scripts/lock.sh" -o "$out" "$@"
done
