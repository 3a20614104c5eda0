#!/usr/bin/env bash
# Install Debian's prometheus package: promtool for the alert-rule unit tests (tests/unit/repo/test_monitoring_rules.py:
# promtool check rules, promtool test rules) and the prometheus binary for the alert e2e test (tests/e2e/test_alerts.py).
# Needs root and apt; says what is missing and what to do otherwise. Idempotent: installs only what is missing.
# The package's systemd unit is not started here (policy-rc.d in containers; the tests start their own Prometheus).
set -euo pipefail
# shellcheck source=scripts/debian-packages.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"
ensure_debian_packages "the alert tests" "or the tests that need promtool and prometheus are skipped" prometheus
