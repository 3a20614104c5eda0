#!/usr/bin/env bash
# What breaks on the newest releases of gpuplane's dependencies, past pyproject.toml's upper bounds.
# Builds a throw-away venv from requirements/dev.lock, upgrades the named packages to their newest
# release on PyPI, then runs import, mypy --strict and the unit tests, and prints one table:
# package, locked, newest, and the outcome of each step. Nothing in the repository changes; run it
# before raising a bound (then scripts/lock.sh --upgrade-package NAME and the whole suite).
#   scripts/upgrade-probe.sh                       # kopf kubernetes aiohttp grpcio protobuf pydantic structlog nvidia-ml-py
#   scripts/upgrade-probe.sh kopf                  # one package
#   UPGRADE_PROBE_PYTEST="-x tests/unit/driver/test_x.py" scripts/upgrade-probe.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACKAGES=("$@")
[ ${#PACKAGES[@]} -gt 0 ] || PACKAGES=(kopf kubernetes aiohttp grpcio protobuf pydantic structlog nvidia-ml-py)
WORK="$(mktemp -d /tmp/gpuplane-upgrade-probe.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
echo "==> venv from requirements/dev.lock in $WORK"
python3 -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet --require-hashes -r "$ROOT/requirements/dev.lock" || { echo "the lock itself does not install" >&2; exit 1; }
"$PY" -m pip install --quiet --no-deps -e "$ROOT"
locked() { "$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
declare -A BEFORE
for p in "${PACKAGES[@]}"; do BEFORE[$p]="$(locked "$p")"; done
echo "==> upgrading ${PACKAGES[*]} to their newest releases (bounds ignored)"
"$PY" -m pip install --quiet --upgrade "${PACKAGES[@]}" 2>&1 | grep -v "^ERROR: pip's dependency resolver" || true
step() {  # name, command...: "ok" or "FAILED (see $WORK/name.log)"
  local name="$1"; shift
  if (cd "$ROOT" && "$@") >"$WORK/$name.log" 2>&1; then echo ok; else echo "FAILED"; tail -25 "$WORK/$name.log" >&2; fi
}
IMPORT=$(step import "$PY" -c 'import gpuplane.driver.main, gpuplane.controller.main')
MYPY=$(step mypy "$WORK/venv/bin/mypy")
# shellcheck disable=SC2086
UNIT=$(step unit "$PY" -m pytest -q -p no:cacheprovider ${UPGRADE_PROBE_PYTEST:-tests/unit})
printf '\n%-16s %-14s %-14s\n' package locked newest
for p in "${PACKAGES[@]}"; do
  now="$(locked "$p")"
  mark=""; [ "$now" = "${BEFORE[$p]}" ] || mark="  (newer)"
  printf '%-16s %-14s %-14s%s\n' "$p" "${BEFORE[$p]}" "$now" "$mark"
done
printf '\nimport: %s   mypy --strict: %s   unit tests: %s\n' "$IMPORT" "$MYPY" "$UNIT"
[ "$IMPORT$MYPY$UNIT" = okokok ]
