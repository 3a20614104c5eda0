"""Controller configuration: flags with GPUPLANE_* environment fallbacks, read once in main()."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuplane.controller import leader, names, supervisor
from gpuplane.httpauth import settings as serving


class ControllerConfig(BaseModel):
    """Everything the controller needs to know about its environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: str | None = None  # None: in-cluster service account
    identity: str = Field(min_length=1)  # this replica's name (pod name): the Lease holder identity
    lease_name: str = names.LEASE_NAME
    lease_namespace: str = names.LEASE_NAMESPACE
    lease_duration_s: float = Field(default=15.0, gt=0)
    renew_deadline_s: float = Field(default=10.0, gt=0)
    retry_period_s: float = Field(default=2.0, gt=0)
    standalone: bool = False  # a single replica without leader election (development)
    liveness: str = "http://127.0.0.1:8080/healthz"  # the Deployment binds the pod IP
    metrics_port: int = 0  # 0: no metrics server
    metrics_host: str = "127.0.0.1"  # the Deployment binds the pod IP (downward API)
    metrics_serving: serving.ServingSettings = serving.ServingSettings()  # HTTPS + token review, or loopback HTTP
    stall_exit_s: float = Field(default=30.0, gt=0)  # event loop silent this long: release the Lease, exit 1
    stop_grace_s: float = Field(default=20.0, gt=0)  # SIGTERM: wait this long for the operator to stop
    fail_invalid_pods: bool = True  # Pending pods of a claim the driver will refuse fail at once (failfast)
    resync_s: float = Field(default=2.0, gt=0)
    claim_explain_after_s: float = Field(default=10.0, ge=0)
    fleet_gauges_interval_s: float = Field(default=30.0, gt=0)  # pending claims, largest free block (fleet_gauges)
    policy: str = "gpuplane"
    aging_s: float = Field(default=60.0, gt=0)
    aging_cap: int = Field(default=10, ge=0)
    starvation_s: float = Field(default=600.0, gt=0)
    status_interval_s: float = Field(default=5.0, ge=0)
    rightsize_resync_s: float = Field(default=10.0, gt=0)
    rebalance: bool = True  # evict noisy neighbours (needs the DeviceTaintRule API)
    rebalance_interval_s: float = Field(default=5.0, gt=0)
    noisy_persist_s: float = Field(default=60.0, ge=0)
    rebalance_cooldown_s: float = Field(default=300.0, gt=0)
    rebalance_budget: int = Field(default=5, ge=0)  # evictions across the cluster per window (0: report only)
    rebalance_budget_window_s: float = Field(default=600.0, gt=0)
    move_ledger: str | None = None  # JSON-lines cost ledger of moves; None: metric and log only
    eviction_grace_s: int | None = Field(default=None, ge=0)  # None: each pod's own grace period
    mig_offer: bool = True  # size the MIG offer (gpuplane.controller.migoffer); off: drivers publish every GPU's
    mig_spare_gpus: int = Field(default=2, ge=0)  # idle GPUs per node pool offered for MIG
    mig_offer_shrink_after_s: float = Field(default=600.0, ge=0)  # an unneeded offered GPU is withdrawn after
    mig_offer_gpus_per_namespace: int = Field(default=16, ge=1)  # GPUs one namespace's waiting MIG claims may hold
    # Gate-and-steer (gpuplane.controller.steer): how the node choice is written into a gated pod
    # ("prefer": a preferred affinity term; "require": required terms narrowed), and how long a pod may
    # stay gated before it is released to the scheduler undecided.
    steer_mode: Literal["prefer", "require"] = "prefer"
    steer_timeout_s: float = Field(default=30.0, gt=0)
    bind_timeout_s: float = Field(default=600.0, ge=0)  # a placement unbound this long is released (0: never)
    # a placement whose IMEX domain is not ready on every node this long after placedAt is released (0: never)
    imex_ready_timeout_s: float = Field(default=300.0, ge=0)
    log_level: str = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"

    @model_validator(mode="after")
    def _lease_timing_is_safe(self) -> ControllerConfig:
        self.lease_timing  # noqa: B018 - raises ValueError when the three durations are unsafe
        return self

    @property
    def supervisor_timing(self) -> supervisor.Timing:
        """How fast the process supervisor reacts to a stalled or failed operator."""
        return supervisor.Timing(stall_exit_s=self.stall_exit_s, stop_grace_s=self.stop_grace_s)

    @property
    def lease_timing(self) -> leader.Timing:
        """Leader-election durations (client-go's leaseDuration, renewDeadline, retryPeriod)."""
        return leader.Timing(self.lease_duration_s, self.renew_deadline_s, self.retry_period_s)


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str]) -> ControllerConfig:
    """Build the config from flags, then ``GPUPLANE_*`` environment variables."""

    def env(name: str, default: str | None = None) -> str | None:
        return environ.get(f"GPUPLANE_{name}", default)

    p = argparse.ArgumentParser(prog="gpuplane-controller", description="gpuplane controller: gangs, claims, domains.")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG") or environ.get("KUBECONFIG"))
    p.add_argument("--identity", default=env("IDENTITY") or environ.get("POD_NAME") or socket.gethostname())
    p.add_argument("--lease-name", default=env("LEASE_NAME", names.LEASE_NAME))
    p.add_argument(
        "--lease-namespace",
        default=env("LEASE_NAMESPACE") or environ.get("POD_NAMESPACE") or names.LEASE_NAMESPACE,
        help="namespace of the leader-election Lease (default: the pod's own namespace)",
    )
    p.add_argument("--lease-duration", type=float, default=float(env("LEASE_DURATION", "15") or 15))
    p.add_argument("--renew-deadline", type=float, default=float(env("RENEW_DEADLINE", "10") or 10))
    p.add_argument("--retry-period", type=float, default=float(env("RETRY_PERIOD", "2") or 2))
    p.add_argument(
        "--standalone",
        action="store_true",
        default=env("STANDALONE") == "1",
        help="no leader election (a single replica, e.g. for development)",
    )
    p.add_argument(
        "--liveness",
        default=env("LIVENESS", "http://127.0.0.1:8080/healthz"),
        help="kopf's health endpoint, http://host:port/path ('' for none)",
    )
    p.add_argument("--metrics-host", default=env("METRICS_HOST", "127.0.0.1"), help="address the metrics bind to")
    p.add_argument("--stall-exit", type=float, default=float(env("STALL_EXIT", "30") or 30))
    p.add_argument("--stop-grace", type=float, default=float(env("STOP_GRACE", "20") or 20))
    p.add_argument(
        "--fail-invalid-pods",
        choices=["true", "false"],
        default=env("FAIL_INVALID_PODS", "true"),
        help="fail the Pending pods of a claim whose config the driver will refuse, releasing its devices",
    )
    p.add_argument("--metrics-port", type=int, default=int(env("METRICS_PORT", "0") or 0))
    serving.add_arguments(p, lambda name, default: env(name, default) or default)
    p.add_argument("--resync", type=float, default=float(env("RESYNC", "2") or 2))
    p.add_argument("--claim-explain-after", type=float, default=float(env("CLAIM_EXPLAIN_AFTER", "10") or 10))
    p.add_argument(
        "--fleet-gauges-interval",
        type=float,
        default=float(env("FLEET_GAUGES_INTERVAL", "30") or 30),
        help="seconds between two passes that set the pending-claim and largest-free-block gauges",
    )
    p.add_argument("--policy", default=env("POLICY", "gpuplane"))
    p.add_argument("--aging", type=float, default=float(env("AGING", "60") or 60))
    p.add_argument("--aging-cap", type=int, default=int(env("AGING_CAP", "10") or 10))
    p.add_argument("--starvation", type=float, default=float(env("STARVATION", "600") or 600))
    p.add_argument("--status-interval", type=float, default=float(env("STATUS_INTERVAL", "5") or 5))
    p.add_argument(
        "--rightsize-resync",
        type=float,
        default=float(env("RIGHTSIZE_RESYNC", "10") or 10),
        help="seconds between re-checks of every GpuRequest against the fleet",
    )
    p.add_argument(
        "--rebalance",
        action=argparse.BooleanOptionalAction,
        default=env("REBALANCE", "1") != "0",
        help="move noisy neighbours off GPUs they share with higher tiers",
    )
    p.add_argument("--rebalance-interval", type=float, default=float(env("REBALANCE_INTERVAL", "5") or 5))
    p.add_argument(
        "--noisy-persist",
        type=float,
        default=float(env("NOISY_PERSIST", "60") or 60),
        help="seconds a noisy-neighbour alert must stand before the offender is moved",
    )
    p.add_argument(
        "--rebalance-cooldown",
        type=float,
        default=float(env("REBALANCE_COOLDOWN", "300") or 300),
        help="seconds after a move before another neighbour is moved off the same GPU",
    )
    p.add_argument(
        "--rebalance-budget",
        type=int,
        default=int(env("REBALANCE_BUDGET", "5") or 5),
        help="at most this many noisy-neighbour evictions across the cluster per --rebalance-budget-window",
    )
    p.add_argument(
        "--rebalance-budget-window",
        type=float,
        default=float(env("REBALANCE_BUDGET_WINDOW", "600") or 600),
        help="seconds of the cluster-wide eviction budget's window",
    )
    p.add_argument(
        "--mig-offer",
        action=argparse.BooleanOptionalAction,
        default=env("MIG_OFFER", "1") != "0",
        help="publish MIG placements only where wanted (docs/mig-offer.md); off: every GPU's, as before",
    )
    p.add_argument("--mig-spare-gpus", type=int, default=int(env("MIG_SPARE_GPUS", "2") or 2))
    p.add_argument("--mig-offer-shrink-after", type=float, default=float(env("MIG_OFFER_SHRINK_AFTER", "600") or 600))
    p.add_argument(
        "--mig-offer-gpus-per-namespace",
        type=int,
        default=int(env("MIG_OFFER_GPUS_PER_NAMESPACE", "16") or 16),
        help="offered GPUs one namespace's waiting MIG claims may be given room on at a time (docs/mig-offer.md)",
    )
    p.add_argument("--move-ledger", default=env("MOVE_LEDGER"), help="JSON-lines ledger of moves (cost format)")
    grace = env("EVICTION_GRACE")
    p.add_argument("--eviction-grace", type=int, default=int(grace) if grace else None)
    p.add_argument(
        "--steer-mode",
        choices=["prefer", "require"],
        default=env("STEER_MODE", "prefer"),
        help="how a steered pod gets its node: a preferred affinity term (default) or narrowed required terms",
    )
    p.add_argument(
        "--steer-timeout",
        type=float,
        default=float(env("STEER_TIMEOUT", "30") or 30),
        help="seconds a pod may stay gated for steering before it is released to the scheduler undecided",
    )
    p.add_argument("--bind-timeout", type=float, default=float(env("BIND_TIMEOUT", "600") or 600))
    p.add_argument(
        "--imex-ready-timeout",
        type=float,
        default=float(env("IMEX_READY_TIMEOUT", "300") or 300),
        help="seconds after placement a gang's IMEX domain may stay not ready before the gang is released (0: never)",
    )
    p.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"))
    p.add_argument("--log-format", choices=["auto", "json", "console"], default=env("LOG_FORMAT", "auto"))
    a = p.parse_args(argv)
    metrics_serving = serving.from_arguments(p, a)
    if a.metrics_port:
        try:
            metrics_serving.check_bind(a.metrics_host, "--metrics-host")
        except ValueError as exc:
            p.error(str(exc))
    return ControllerConfig(
        kubeconfig=a.kubeconfig,
        identity=a.identity,
        lease_name=a.lease_name,
        lease_namespace=a.lease_namespace,
        lease_duration_s=a.lease_duration,
        renew_deadline_s=a.renew_deadline,
        retry_period_s=a.retry_period,
        standalone=a.standalone,
        liveness=a.liveness,
        metrics_port=a.metrics_port,
        metrics_host=a.metrics_host,
        metrics_serving=metrics_serving,
        stall_exit_s=a.stall_exit,
        stop_grace_s=a.stop_grace,
        fail_invalid_pods=a.fail_invalid_pods == "true",
        resync_s=a.resync,
        claim_explain_after_s=a.claim_explain_after,
        fleet_gauges_interval_s=a.fleet_gauges_interval,
        policy=a.policy,
        aging_s=a.aging,
        aging_cap=a.aging_cap,
        starvation_s=a.starvation,
        status_interval_s=a.status_interval,
        rightsize_resync_s=a.rightsize_resync,
        rebalance=a.rebalance,
        rebalance_interval_s=a.rebalance_interval,
        noisy_persist_s=a.noisy_persist,
        rebalance_cooldown_s=a.rebalance_cooldown,
        rebalance_budget=a.rebalance_budget,
        rebalance_budget_window_s=a.rebalance_budget_window,
        move_ledger=a.move_ledger,
        eviction_grace_s=a.eviction_grace,
        mig_offer=a.mig_offer,
        mig_spare_gpus=a.mig_spare_gpus,
        mig_offer_shrink_after_s=a.mig_offer_shrink_after,
        mig_offer_gpus_per_namespace=a.mig_offer_gpus_per_namespace,
        steer_mode=a.steer_mode,
        steer_timeout_s=a.steer_timeout,
        bind_timeout_s=a.bind_timeout,
        imex_ready_timeout_s=a.imex_ready_timeout,
        log_level=a.log_level,
        log_format=a.log_format,
    )
