#!/usr/bin/env bash
# Debian's Chromium (headless) for the tests that render the fleet map's HTML and look at the screenshot
# (tests/browserkit.py), and for the demo's fleet.png. Needs root and apt; idempotent.
set -euo pipefail
# shellcheck source=scripts/debian-packages.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"
ensure_debian_packages "the fleet map's rendering tests" "or those tests are skipped (the demo writes no fleet.png)" \
  chromium fonts-dejavu-core
