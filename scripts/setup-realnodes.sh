#!/usr/bin/env bash
# Install the Debian packages the e2e suite's real nodes need (e2e/cluster/realnode, e2e/plane/realnode): runc, the CNI plugins
# (bridge, host-local, loopback, portmap), busybox-static (the busybox image), iproute2 and iptables.
# Needs root and apt; says what is missing and what to do otherwise. Idempotent: installs only what is missing.
set -euo pipefail
# shellcheck source=scripts/debian-packages.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-packages.sh"
ensure_debian_packages "real nodes" "or run without real nodes (python -m e2e up/demo --real-nodes '')" \
  runc containernetworking-plugins busybox-static iproute2 iptables
