#!/usr/bin/env bash
# Install Debian's prometheus package: promtool for the alert-rule unit tests (tests/unit/test_monitoring_rules.py:
# promtool check rules, promtool test rules) and the prometheus binary for the alert e2e test (tests/e2e/test_alerts.py).
# Needs root and apt; says what is missing and what to do otherwise. Idempotent: installs only what is missing.
# The package's systemd unit is not started here (policy-rc.d in containers; the tests start their own Prometheus).
set -euo pipefail
PACKAGES=(prometheus)
missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "monitoring packages present: ${PACKAGES[*]}"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "the alert tests need these Debian packages: ${missing[*]}; run this script as root (sudo $0)," >&2
  echo "or the tests that need promtool and prometheus are skipped" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get not found: install ${missing[*]} (promtool, prometheus) with this system's package manager" >&2
  exit 1
fi
echo "==> apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 update -q || echo "apt-get update failed; trying the package lists there are" >&2
apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
