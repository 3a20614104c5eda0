"""Prometheus metrics of the node driver (one registry, created in main and passed in).

Served by gpuplane.driver.probes.serve (a bearer token allowed to ``get /metrics``: they name tenants' claims).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class DriverMetrics:
    """Implements the state's Observer and the gRPC layer's timing hook."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.rpc_seconds = Histogram(
            "gpuplane_driver_rpc_duration_seconds",
            "NodePrepareResources/NodeUnprepareResources call latency",
            ["op"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.prepare_seconds = Histogram(
            "gpuplane_driver_prepare_duration_seconds",
            "Per-claim prepare latency by device kind (gpu, mig, mps)",
            ["kind"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "gpuplane_driver_errors_total", "Failed prepare/unprepare by reason", ["op", "reason"], registry=r
        )
        self.prepared_claims = Counter(
            "gpuplane_driver_prepared_claims_total", "Claims prepared, by kind", ["kind"], registry=r
        )
        self.mig_instances = Gauge("gpuplane_driver_mig_instances", "MIG instances owned by claims", registry=r)
        self.mps_daemons = Gauge("gpuplane_driver_mps_daemons", "Running per-claim MPS control daemons", registry=r)
        self.mig_owed = Gauge(
            "gpuplane_driver_mig_instances_owed",
            "MIG instances owed: made for a claim, not destroyed at its unprepare because the GPU fell off the bus",
            registry=r,
        )
        self.devices_published = Gauge(
            "gpuplane_driver_devices_published", "Devices in this node's ResourceSlices", registry=r
        )
        self.devices_allocated = Gauge(
            "gpuplane_driver_devices_prepared", "Devices held by prepared claims on this node", registry=r
        )
        self.imex_daemon_exits = Counter(
            "gpuplane_driver_imex_daemon_exits",
            "nvidia-imex exits seen by the driver (--imex-daemons=process; each restarted with backoff), by exit code",
            ["code"],
            registry=r,
        )
        self.slice_writes = Counter(
            "gpuplane_driver_resourceslice_writes",
            "ResourceSlice API writes by kind (create, replace, delete; reorder: in place, same generation)",
            ["verb"],
            registry=r,
        )

    # Observer
    def prepared(self, kind: str, seconds: float) -> None:
        self.prepare_seconds.labels(kind).observe(seconds)
        self.prepared_claims.labels(kind).inc()

    def failed(self, op: str, reason: str) -> None:
        self.errors.labels(op, reason).inc()

    def hardware_changed(self, mig_instances: int, mps_daemons: int, devices_prepared: int, mig_owed: int) -> None:
        """After every discovery and prepare/unprepare batch, from the state's in-memory checkpoint."""
        self.mig_instances.set(mig_instances)
        self.mps_daemons.set(mps_daemons)
        self.devices_allocated.set(devices_prepared)
        self.mig_owed.set(mig_owed)

    # gRPC timing hook
    def rpc(self, op: str, seconds: float, n_errors: int) -> None:
        self.rpc_seconds.labels(op).observe(seconds)
