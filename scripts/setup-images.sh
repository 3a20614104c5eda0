#!/usr/bin/env bash
# Install what building the images needs (Debian's packages): buildah (the image builder)
# and mmdebstrap (the offline Python base's rootfs). Run as root; CI runs it from test.sh.
set -euo pipefail
if command -v buildah >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "building images needs buildah and mmdebstrap from Debian's packages; as root run:" >&2
  echo "  apt-get install -y --no-install-recommends buildah mmdebstrap" >&2
  exit 1
fi
echo "==> installing buildah and mmdebstrap (apt)"
apt-get -o DPkg::Lock::Timeout=300 update -qq
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends \
  buildah mmdebstrap >/dev/null
