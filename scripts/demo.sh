#!/usr/bin/env bash
# The main job: build what is missing, start a local control plane with simulated GPU nodes and
# (where the machine allows: root) one real node (kubelet + containerd), install gpuplane from
# manifests/, run the example workloads and print where they landed and what real containers saw.
# The cluster keeps running; `scripts/demo.sh down` stops it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/bootstrap.sh
. "$ROOT/scripts/bootstrap.sh"
if [ "${1:-}" = "down" ]; then
  shift
  exec python -m e2e down "$@"
fi
if [ "$(id -u)" -eq 0 ]; then
  # runc, CNI plugins, busybox-static for the real node; without them the demo runs simulated nodes only
  # (python -m e2e demo says why in one line).
  bash "$ROOT/scripts/setup-realnodes.sh" || echo "real-node packages could not be installed (above); going on without them" >&2
fi
exec python -m e2e demo "$@"
