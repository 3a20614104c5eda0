"""Prometheus metrics of the controller: placement decisions, gang wait time, queue depth, the fleet's gauges.

One :class:`ControllerMetrics` per process on its own registry (so tests can
make as many as they like), created in main() and kept in the operator memo.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import prometheus_client as prom

from gpuplane.httpauth import review, server, settings
from gpuplane.informer.cache import Informer
from gpuplane.informer.workqueue import WorkQueue


class ControllerMetrics:
    """The controller's metrics on a private registry."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.decisions = prom.Counter(
            "gpuplane_gang_decisions_total",
            "Gang decisions by outcome (place, wait, unschedulable, preempt, timeout, release).",
            ["outcome"],
            registry=self.registry,
        )
        self.wait_seconds = prom.Histogram(
            "gpuplane_gang_wait_seconds",
            "Seconds from a gang being ready (all members present) to its placement.",
            buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=self.registry,
        )
        self.queue_depth = prom.Gauge(
            "gpuplane_gang_queue_depth", "Gangs waiting for a placement.", registry=self.registry
        )
        self.pass_seconds = prom.Histogram(
            "gpuplane_queue_pass_seconds",
            "Duration of one queue pass (snapshot build and placement of every waiting gang).",
            registry=self.registry,
        )
        self.status_writes = prom.Counter(
            "gpuplane_gang_status_writes_total", "Status patches written to GpuGang objects.", registry=self.registry
        )
        self.claim_findings = prom.Counter(
            "gpuplane_claim_findings_total",
            "ResourceClaim findings reported (invalid config, unallocated, missing domain constraint).",
            ["finding"],
            registry=self.registry,
        )
        self.rebalance = prom.Counter(
            "gpuplane_rebalance_decisions_total",
            "Noisy-neighbour moves by outcome (evicted, refused, bare-pod, shared-claim, cooldown, no-taint-rules).",
            ["outcome"],
            registry=self.registry,
        )
        self.moved_gpu_seconds = prom.Counter(
            "gpuplane_rebalance_gpu_seconds_lost_total",
            "GPU-seconds moved pods lost between their eviction and their replacement running.",
            ["namespace", "tier"],
            registry=self.registry,
        )
        self.steer_decisions = prom.Counter(
            "gpuplane_steer_decisions_total",
            "Pods released from the steering gate, by outcome (steered, no-room, unsteerable, pinned, timeout).",
            ["outcome"],
            registry=self.registry,
        )
        self.steer_seconds = prom.Histogram(
            "gpuplane_steer_gate_seconds",
            "Seconds from this replica first seeing a pod gated to its gate being lifted.",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.steer_pass_seconds = prom.Histogram(
            "gpuplane_steer_pass_seconds",
            "Duration of one steering pass (view build and one decision per gated pod).",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1),
            registry=self.registry,
        )
        self.untrusted_slices = prom.Counter(
            "gpuplane_untrusted_slices_total",
            "ResourceSlice events of this driver not read: no node (no-node), pool not the node (pool-not-node).",
            ["reason"],
            registry=self.registry,
        )

        # Set by gpuplane.controller.fleet_gauges, one pass per interval on every replica (observations, not
        # decisions: a standby's indexes are warm, so the figures survive a change of leader).
        self.claims_pending = prom.Gauge(
            "gpuplane_claims_pending",
            "gpuplane ResourceClaims a pod waits for that have no allocation yet.",
            registry=self.registry,
        )
        self.claim_pending_oldest = prom.Gauge(
            "gpuplane_claim_pending_oldest_seconds",
            "Age of the oldest of those claims (0 when none).",
            registry=self.registry,
        )
        self.largest_free_block = prom.Gauge(
            "gpuplane_fleet_largest_free_block_gpus",
            "Largest TP group of whole free GPUs one NVLink domain can still host, per GPU product.",
            ["product"],
            registry=self.registry,
        )
        self.free_gpus = prom.Gauge(
            "gpuplane_fleet_free_gpus",
            "Whole GPUs no claim holds or gang reserves, per GPU product.",
            ["product"],
            registry=self.registry,
        )

        self.leader_terms = prom.Counter(
            "gpuplane_controller_leader_terms_total",
            "Times this replica became the leader (took or re-took the leader Lease).",
            registry=self.registry,
        )
        self.is_leader = prom.Gauge(
            "gpuplane_controller_is_leader", "1 while this replica holds the leader Lease.", registry=self.registry
        )

        self.informer_synced = prom.Gauge(
            "gpuplane_controller_informer_synced",
            "1 once the stream's informer applied its first complete list (nothing is decided before every one is).",
            ["stream"],
            registry=self.registry,
        )
        self.informer_objects = prom.Gauge(
            "gpuplane_controller_informer_objects",
            "Objects of the stream held in its indexes.",
            ["stream"],
            registry=self.registry,
        )
        self.informer_failures = prom.Gauge(
            "gpuplane_controller_informer_failures",
            "Lists and watches of the stream that failed and were retried since the start (a counter's value).",
            ["stream"],
            registry=self.registry,
        )
        self.workqueue_depth = prom.Gauge(
            "gpuplane_controller_workqueue_depth", "Keys waiting in a work queue.", ["queue"], registry=self.registry
        )

    def observe(self, informers: Iterable[Informer], queues: Iterable[WorkQueue[Any]]) -> None:
        """The informers' and work queues' gauges, read at each scrape."""
        for inf in informers:
            name = inf.stream.name
            self.informer_synced.labels(stream=name).set_function(functools.partial(_synced, inf))
            self.informer_objects.labels(stream=name).set_function(functools.partial(_size, inf))
            self.informer_failures.labels(stream=name).set_function(functools.partial(_failures, inf))
        for q in queues:
            self.workqueue_depth.labels(queue=q.name).set_function(functools.partial(_depth, q))

    def serve(
        self,
        port: int,
        address: str = "127.0.0.1",
        *,
        serving: settings.ServingSettings,
        reviewer: Callable[[], review.Reviewer] | None = None,
    ) -> server.Server:
        """Serve /metrics in daemon threads: HTTPS behind a token review, or (auth none) loopback HTTP.

        Gang names, namespaces and tiers are in these metrics: a scraper needs a bearer token allowed to
        ``get /metrics`` (the gpuplane-metrics-reader ClusterRole), as the driver's (gpuplane.httpauth).
        """

        def no_reviewer() -> review.Reviewer:
            raise ValueError("--metrics-auth=kubernetes needs the API client for its token reviews")

        host = f"[{address}]" if ":" in address else address
        return server.serve_metrics(
            f"{host}:{port}",
            prom.make_wsgi_app(self.registry),
            serving,
            reviewer=reviewer or no_reviewer,
            common_name="gpuplane-controller",
        )


def _synced(i: Informer) -> float:
    return float(i.synced.is_set())


def _size(i: Informer) -> float:
    return float(i.size())


def _failures(i: Informer) -> float:
    return float(i.counters.failures)


def _depth(q: WorkQueue[Any]) -> float:
    return float(len(q))
