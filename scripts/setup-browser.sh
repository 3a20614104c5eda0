#!/usr/bin/env bash
# Debian's Chromium (headless) for the tests that render the fleet map's HTML and look at the screenshot
# (tests/browserkit.py), and for the demo's fleet.png. Run as root; idempotent.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get not found: install Chromium with this system's package manager (the rendering tests need it)" >&2
  exit 1
fi
echo "==> apt-get install chromium fonts-dejavu-core"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 update -q || echo "apt-get update failed; trying the package lists there are" >&2
apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends chromium fonts-dejavu-core
chromium --version
