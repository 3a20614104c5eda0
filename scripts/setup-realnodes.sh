#!/usr/bin/env bash
# Install the Debian packages the e2e suite's real nodes need (e2e/cluster/realnode, e2e/plane/realnode): runc, the CNI plugins
# (bridge, host-local, loopback, portmap), busybox-static (the busybox image), iproute2 and iptables.
# Needs root and apt; says what is missing and what to do otherwise. Idempotent: installs only what is missing.
set -euo pipefail
PACKAGES=(runc containernetworking-plugins busybox-static iproute2 iptables)
missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "real-node packages present: ${PACKAGES[*]}"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "real nodes need these Debian packages: ${missing[*]}; run this script as root (sudo $0)," >&2
  echo "or run without real nodes (python -m e2e up/demo --real-nodes '')" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "apt-get not found: install ${missing[*]} with this system's package manager" >&2
  exit 1
fi
echo "==> apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 update -q || echo "apt-get update failed; trying the package lists there are" >&2
apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
