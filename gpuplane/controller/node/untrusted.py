"""A ResourceSlice of this driver the controller does not read (its pool is not its node's): counted and logged.

:func:`gpuplane.controller.node.slice_index.untrusted` decides; the slice index calls :func:`report` for each
such slice event, so an operator sees a forged or misconfigured slice (metric
``gpuplane_untrusted_slices_total{reason}``, a log line naming it) instead of nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpuplane.api import names as dn
from gpuplane.controller import metrics as metrics_mod

log = logging.getLogger(__name__)


def report(metrics: metrics_mod.ControllerMetrics, name: str, spec: Mapping[str, Any], reason: str) -> None:
    """Count and log one event of a slice that is not read (every field as the writer wrote it: bounded)."""
    metrics.untrusted_slices.labels(reason=reason).inc()
    pool = spec.get("pool")
    log.warning(
        "ResourceSlice %.253s of %s not read (%s): pool %.255r, nodeName %.255r; the driver publishes its own "
        "node's pool only (policy gpuplane-own-node-slices)",
        name,
        dn.DRIVER_NAME,
        reason,
        pool.get("name") if isinstance(pool, Mapping) else pool,
        spec.get("nodeName"),
    )
