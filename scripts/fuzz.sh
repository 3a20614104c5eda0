#!/usr/bin/env bash
# Nightly-style fuzz run: the CI's hostile-input fuzz (tests/unit/api/test_fuzz.py, 10,500 cases, derandomized)
# at GPUPLANE_FUZZ_SCALE times the cases (default 20: 210,000), with fresh random inputs every run.
# Prints each test's case count, time and slowest case. Usage: scripts/fuzz.sh [SCALE]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/bootstrap.sh
. "$ROOT/scripts/bootstrap.sh"
export GPUPLANE_FUZZ_SCALE="${1:-${GPUPLANE_FUZZ_SCALE:-20}}"
echo "==> fuzz at scale ${GPUPLANE_FUZZ_SCALE} ($((10500 * GPUPLANE_FUZZ_SCALE)) cases)"
python -m pytest -q -s -p no:cacheprovider --timeout=0 tests/unit/api/test_fuzz.py
