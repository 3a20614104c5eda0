"""gpuplane-controller: read the config once, configure logging once, elect a leader, run the kopf operator.

Two or more replicas run the same kopf handlers, so every replica's indexes
(its caches of API state) stay warm. Only the replica holding the
``coordination.k8s.io/v1`` Lease (:mod:`gpuplane.controller.leader`, renewed in a
background thread) makes placement decisions and writes claims, pods, status,
labels and Events; the others return early from every handler. When the leader
dies its Lease expires after ``--lease-duration`` seconds and a standby takes
it; a leader that cannot renew within ``--renew-deadline`` stops writing before
that can happen. Every decision lives in the API (gang status, claim
annotations and owner references), so the new leader resumes exactly where the
old one stopped. kopf runs without its own peering (``standalone``): peering
paused the standby's watches, so its caches went cold, and it was not a lease.

What the controller reads comes through gpuplane's informers (:mod:`gpuplane.informer`, streams in
:mod:`gpuplane.controller.caches`, wired in :mod:`gpuplane.controller.handlers`); kopf watches only
GpuGangs and GpuRequests. The informers, their work queues and kopf run in one event loop in a
thread under :class:`gpuplane.controller.supervisor.Supervisor`, which owns SIGTERM and the exit: a
replica whose operator, informers or event loop have failed releases the Lease and exits non-zero,
whatever state kopf is in; kopf still serves ``/healthz`` (:mod:`gpuplane.controller.probes`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import kopf
import structlog

from gpuplane import logs
from gpuplane.controller import (
    config,
    handlers,
    heap,
    kube,
    leader,
    memdump,
    metrics,
    probes,
    runtime,
    supervisor,
)
from gpuplane.controller.migoffer import decide as migoffer_decide
from gpuplane.controller.migoffer import reconcile as migoffer
from gpuplane.controller.steer import reconciler as steer_reconciler
from gpuplane.httpauth.review import RequestReviewer
from gpuplane.informer.blocking import BlockingClient
from gpuplane.informer.client import Client, Endpoint

log = structlog.get_logger(__name__)


def _login(cfg: config.ControllerConfig) -> kopf.ConnectionInfo:
    """Credentials for kopf from the same kubeconfig (or service account) as our client (read again: it rotates)."""
    c = kube.load_configuration(cfg.kubeconfig)
    token = (c.api_key or {}).get("authorization") or (c.api_key or {}).get("BearerToken")
    scheme = None
    if token and " " in token:
        scheme, token = token.split(" ", 1)
    return kopf.ConnectionInfo(
        server=c.host,
        ca_path=c.ssl_ca_cert,
        insecure=not c.verify_ssl,
        certificate_path=c.cert_file,
        private_key_path=c.key_file,
        scheme=scheme,
        token=token,
    )


def make_elector(cfg: config.ControllerConfig, endpoint: Endpoint) -> leader.Elector:
    """The Lease elector of this replica: its own client and loop (a renewal never queues behind a write),
    requests timing out well within the renew deadline."""
    timing = cfg.lease_timing
    api = BlockingClient(endpoint)
    store = leader.KubeLeaseStore(api, cfg.lease_namespace, cfg.lease_name, timing.renew_deadline_s / 2)
    return leader.Elector(cfg.identity, store, timing)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuplane-controller`` console script (ends the process with its exit code)."""
    cfg = config.parse_args(argv, os.environ)
    logs.configure(cfg.log_level, cfg.log_format)
    heap.configure()  # before any thread: few malloc arenas (each thread would fragment its own)
    memdump.install()  # kill -USR2: what the memory is made of ($TMPDIR/gpuplane-controller-memory-<pid>.txt)
    endpoint = Endpoint.of(kube.load_configuration(cfg.kubeconfig))
    writes = BlockingClient(endpoint)  # the writes and the few direct reads, from worker threads
    m = metrics.ControllerMetrics()
    if cfg.metrics_port:
        reviewer = lambda: RequestReviewer(writes)  # noqa: E731
        m.serve(cfg.metrics_port, cfg.metrics_host, serving=cfg.metrics_serving, reviewer=reviewer)
    elector = None if cfg.standalone else make_elector(cfg, endpoint)
    leadership: leader.Leadership = elector if elector is not None else leader.AlwaysLeader()
    m.is_leader.set_function(lambda: float(leadership.is_leader()))
    memo = runtime.Runtime.create(cfg, kube.KubeWriter(writes, guard=leadership.is_leader), m, leadership)
    client = Client(endpoint)  # the informers' lists and watches, in the operator's loop
    reads = handlers.make_reads(cfg, memo, client)  # memo.caches: the informers' indexes
    registry = handlers.make_registry(cfg)
    migoffer.register(
        registry,
        migoffer_decide.Settings(
            spare_per_pool=cfg.mig_spare_gpus,
            shrink_after_s=cfg.mig_offer_shrink_after_s,
            gpus_per_namespace=cfg.mig_offer_gpus_per_namespace,
        ),
        enabled=cfg.mig_offer,
        opted_in=lambda rt: rt.state(steer_reconciler.SteerState).opted_in,
    )
    probes.add_probes(registry, elector)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return _login(cfg)

    async def operate(stop: threading.Event, failed: Callable[[str], None]) -> None:
        """The informers, their queues and kopf.operator (spelled out): any root task ending is reported at once."""
        existing = asyncio.all_tasks()
        client.open()
        ours = [asyncio.create_task(work, name=name) for name, work in reads.runs()]
        tasks = await kopf.spawn_tasks(
            registry=registry,
            memo=memo,
            standalone=True,  # no kopf peering: the Lease decides who writes
            clusterwide=True,
            # kopf would otherwise derive one from getpass.getuser(), which raises in the image: its
            # user 65532 has no passwd entry (found by the first run of the Deployment on a real node).
            identity=cfg.identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
            stop_flag=stop,
            liveness_endpoint=cfg.liveness or None,  # kopf's /healthz, with the probe of probes.py
        )

        async def first_end() -> None:
            done, _ = await asyncio.wait([*tasks, *ours], return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                task = next(iter(done))
                error = None if task.cancelled() else task.exception()
                failed(f"{task.get_name()!r} ended: {error!r}")

        watch = asyncio.create_task(first_end(), name="gpuplane root-task watch")
        try:
            await kopf.run_tasks(tasks, ignored=existing)
        finally:
            watch.cancel()
            for task in ours:
                task.cancel()
            await asyncio.gather(*ours, return_exceptions=True)
            await client.close()

    def release() -> None:
        if elector is not None:
            elector.stop(release=True)

    sup = supervisor.Supervisor(operate, release=release, timing=cfg.supervisor_timing)
    sup.install_signal_handlers()
    log.info(
        "starting",
        identity=cfg.identity,
        lease=None if cfg.standalone else f"{cfg.lease_namespace}/{cfg.lease_name}",
        standalone=cfg.standalone,
    )
    if elector is not None:
        elector.start()
    code = sup.run()
    log.info("exiting", code=code)
    supervisor.exit_now(code)
    return code  # pragma: no cover - exit_now does not return


if __name__ == "__main__":
    sys.exit(main())
