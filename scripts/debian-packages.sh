#!/usr/bin/env bash
# Sourced by the setup-*.sh scripts: install the Debian packages a part of the test suite needs, once.
#
#   ensure_debian_packages WHAT IF_NOT_ROOT PACKAGE...
#
# Installs only the packages dpkg does not list as installed. WHAT names who needs them (in the lines it
# prints); IF_NOT_ROOT is the second line said to a non-root caller (what to do instead). Without root or
# without apt-get it says what is missing and returns 1. Idempotent.
ensure_debian_packages() {
  local what="$1" if_not_root="$2"
  shift 2
  local package missing=()
  for package in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$package")
    fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "$what: packages present: $*"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "$what need these Debian packages: ${missing[*]}; run this script as root (sudo $0)," >&2
    echo "$if_not_root" >&2
    return 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-get not found: install ${missing[*]} ($what) with this system's package manager" >&2
    return 1
  fi
  echo "==> apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -q || echo "apt-get update failed; trying the package lists there are" >&2
  apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
}
