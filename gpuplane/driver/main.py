"""gpuplane-driver: wire configuration, hardware, API, state, slices and the kubelet sockets together."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

import structlog

from gpuplane import logs
from gpuplane.api import kubetime
from gpuplane.driver import config as config_mod
from gpuplane.driver import probes
from gpuplane.driver.hw import interface as hw
from gpuplane.driver.hw.select import make_backend
from gpuplane.driver.hw.sim import SimConfig
from gpuplane.driver.inventory import Inventory
from gpuplane.driver.kube import KubeApi, ReviewRequests, make_api_client
from gpuplane.driver.metrics import DriverMetrics
from gpuplane.driver.observe import cost, health, noisy, noisy_taints, telemetry
from gpuplane.driver.observe.claim_notices import ClaimNotices
from gpuplane.driver.observe.health_board import HealthBoard
from gpuplane.driver.observe.health_watcher import HealthMetrics, HealthWatcher
from gpuplane.driver.observe.noisy_taints import NoisyTaints
from gpuplane.driver.observe.telemetry_metrics import TelemetryMetrics
from gpuplane.driver.observe.tiers import TierResolver
from gpuplane.driver.plugin.server import PluginServer
from gpuplane.driver.prepare import imex_claims
from gpuplane.driver.prepare.checkpoint import read_boot_id
from gpuplane.driver.prepare.state import DeviceState, StateSettings
from gpuplane.driver.publish import steering
from gpuplane.driver.publish.claim_status import ClaimStatusReporter
from gpuplane.driver.publish.offer_watch import OfferWatch
from gpuplane.driver.publish.publisher import Layout, SlicePublisher
from gpuplane.driver.publish.slices import DeviceTaint, PoolContent
from gpuplane.driver.sharing.imex_pods import ImexPodDaemons
from gpuplane.driver.sharing.imex_runner import ImexDaemons, StatusApi
from gpuplane.driver.sharing.mps import MpsControl
from gpuplane.driver.sharing.mps_pods import DaemonPods, PodTemplate
from gpuplane.driver.sharing.mps_spec import MpsError
from gpuplane.httpauth.review import RequestReviewer
from gpuplane.placement.fragmentation import SizeMix

log = structlog.get_logger(__name__)

# The loops /healthz watches (gpuplane.driver.probes).
MAIN_LOOP = "main-loop"
HEALTH_LOOP = "health-watcher"


def _sim_config(cfg: config_mod.DriverConfig) -> SimConfig | None:
    if cfg.backend != "sim":
        return None
    state_dir = cfg.sim_state_dir or (cfg.plugin_dir / "sim")
    if cfg.sim_config_file is not None:
        overrides: dict[str, object] = {"state_dir": state_dir, "node_name": cfg.node_name}
        if cfg.sim_profile:
            overrides["profile"] = cfg.sim_profile
        return SimConfig.from_file(cfg.sim_config_file, **overrides)
    assert cfg.sim_profile is not None
    return SimConfig(profile=cfg.sim_profile, state_dir=state_dir, node_name=cfg.node_name)


SHUTDOWN_GRACE_S = 20.0


def _daemon_pods(cfg: config_mod.DriverConfig, api: KubeApi) -> DaemonPods | None:
    """With --mps-daemons=pod: the daemon pods' calls, their template read from the driver's own pod."""
    if cfg.mps_daemons != "pod":
        return None
    own = api.get_pod(cfg.pod_namespace, cfg.pod_name)
    if own is None:
        raise MpsError(f"--mps-daemons=pod: the driver's own pod {cfg.pod_namespace}/{cfg.pod_name} was not found")
    template = PodTemplate.from_driver_pod(own, cfg.mps_root)
    if template.node_name != cfg.node_name:
        raise MpsError(f"--mps-daemons=pod: the driver's pod runs on {template.node_name!r}, not {cfg.node_name!r}")
    log.info("mps daemons run in pods of their own", image=template.image, namespace=template.namespace)
    return DaemonPods(api, template, cfg.mps_control_binary)


def _imex_gate(cfg: config_mod.DriverConfig, backend: hw.GpuBackend, api: KubeApi) -> imex_claims.Gate:
    """The controller's IMEX plan read at prepare; the simulator's own /proc/devices and placeholder nodes."""
    proc_devices = getattr(backend, "proc_devices", None)  # the simulator's file; a real node's kernel's
    settings = imex_claims.Settings(
        node=cfg.node_name,
        dev_dir=backend.device_node_dir() or cfg.dev_root,
        proc_devices=proc_devices if isinstance(proc_devices, Path) else Path("/proc/devices"),
        placeholder_ok=cfg.backend == "sim",
        require_status=cfg.imex_daemons != "off",  # with daemons, a domain is ready only once they say so
        group_wait_s=cfg.imex_group_wait_s,
    )
    return imex_claims.Gate(
        api.list_imex_domains, settings, lambda claim, why: api.claim_event(claim, "ImexGroupNoDomain", why)
    )


def _imex_daemons(cfg: config_mod.DriverConfig, api: KubeApi, metrics: DriverMetrics) -> ImexDaemons | None:
    """With --imex-daemons=process|pod: this node's nvidia-imex, run and reported (started after recovery)."""
    if cfg.imex_daemons == "off":
        return None
    directory = cfg.plugin_dir / "imex"
    args = (cfg.node_name, directory, api.list_imex_domains, StatusApi(api.api_client))

    def on_exit(code: int) -> None:
        metrics.imex_daemon_exits.labels(str(code)).inc()

    if cfg.imex_daemons == "process":
        return ImexDaemons(
            *args, binary=cfg.imex_binary, ctl_binary=cfg.imex_ctl_binary, port=cfg.imex_port, on_exit=on_exit
        )
    own = api.get_pod(cfg.pod_namespace, cfg.pod_name)
    if own is None:
        raise MpsError(f"--imex-daemons=pod: the driver's own pod {cfg.pod_namespace}/{cfg.pod_name} was not found")
    template = PodTemplate.from_driver_pod(own, directory)
    log.info("the imex daemon runs in a pod of its own", image=template.image, namespace=template.namespace)
    return ImexPodDaemons(
        *args,
        pods=api,
        template=template,
        binary=cfg.imex_binary,
        ctl_binary=cfg.imex_ctl_binary,
        port=cfg.imex_port,
        on_exit=on_exit,
    )


def run(cfg: config_mod.DriverConfig, stop: threading.Event) -> int:
    backend = make_backend(cfg.backend, _sim_config(cfg))
    backend.init()
    try:
        # The simulator models a node, reboots included: its boot id stands in for the kernel's.
        sim_boot = getattr(backend, "boot_id", None)
        boot_id = sim_boot() if callable(sim_boot) else read_boot_id(cfg.boot_id_file)
        metrics = DriverMetrics()
        published = threading.Event()
        # Not ready until the slices are out and kubelet has registered the plugin (the check is
        # replaced by the server's own once it runs).
        checks = probes.Probes(
            stale_after_s=cfg.liveness_stale_after_s,
            ready_checks={"slices-published": published.is_set, "kubelet-registered": lambda: False},
        )
        api_client = make_api_client(cfg.kubeconfig)
        api = KubeApi(api_client)
        http = (
            probes.serve(
                cfg.metrics_address,
                metrics.registry,
                checks,
                serving=cfg.metrics_serving,
                reviewer=lambda: RequestReviewer(ReviewRequests(api_client)),
                health_address=cfg.health_address,
            )
            if cfg.metrics_address
            else []
        )
        for endpoint in http:
            log.info("serving", tls=endpoint.tls, port=endpoint.port, auth=cfg.metrics_serving.auth)
        mps = MpsControl(
            cfg.mps_root,
            cfg.mps_control_binary,
            start_timeout_s=cfg.mps_start_timeout_s,
            boot_id_file=cfg.boot_id_file,
            pods=_daemon_pods(cfg, api),
        )
        state = DeviceState(
            StateSettings(
                node_name=cfg.node_name,
                driver_name=cfg.driver_name,
                cdi_root=cfg.cdi_root,
                checkpoint_path=cfg.checkpoint_path,
                lock_path=cfg.lock_path,
                boot_id=boot_id,
                dev_root=cfg.dev_root,
                check_host_device_nodes=True,
                mig_placements=cfg.mig_placements,
            ),
            backend,
            api,
            mps,
            observer=metrics,
        )
        state.imex = _imex_gate(cfg, backend, api)
        imex_daemons = _imex_daemons(cfg, api, metrics)
        wake = threading.Event()
        board = HealthBoard()
        notices = ClaimNotices(state.snapshot, api)

        def on_health_change() -> None:
            """Taints changed: republish the slices, tell the claims on newly unhealthy GPUs."""
            wake.set()
            try:
                notices.notify(watcher.taints(), {g.info.uuid: g.name for g in state.inventory().gpus})
            except Exception:  # the watcher thread must go on; the taint is published either way
                log.exception("could not tell the claims of unhealthy GPUs")

        watcher = HealthWatcher(
            backend,
            health.HealthSettings(clear_after_s=cfg.taint_clear_after_s, benign_xids=frozenset(cfg.benign_xids)),
            board,
            state.inventory,
            cfg.node_name,
            on_change=on_health_change,
            poll_interval_s=cfg.health_poll_interval_s,
            metrics=HealthMetrics(metrics.registry),
            state_file=cfg.plugin_dir / "health.json",
            boot_id=boot_id,
            heartbeat=lambda: checks.beat(HEALTH_LOOP),
        )
        noisy_settings = noisy.NoisySettings(
            threshold=cfg.noisy_bandwidth_threshold, release=cfg.noisy_release_threshold, sustain_s=cfg.noisy_sustain_s
        )
        alerts: list[Callable[[], list[noisy.Alert]]] = []  # the sampler's detector, once it exists
        noisy_on_gpus = NoisyTaints(lambda: alerts[0]() if alerts else [], noisy_settings)
        steer = steering.SteeringSettings(
            order=cfg.steer_order,
            withhold=cfg.withhold_stranding,
            mix=SizeMix.parse(cfg.steer_mix) if cfg.steer_mix else None,
        )
        layout: Layout | None = None
        if steer.active:
            started = kubetime.rfc3339()
            steered = steering.SteeredLayout(steer, taint_time=started)

            def layout(inv: Inventory, taints: Mapping[str, Sequence[DeviceTaint]]) -> PoolContent:
                return steered.build_pool(inv, steering.gpu_states(inv, state.snapshot()), cfg.driver_name, taints)

            if steer.order:
                state.on_claims_change = wake.set
            log.info("steering the default scheduler", order=steer.order, withhold=steer.withhold)
        publisher = SlicePublisher(
            api,
            cfg.node_name,
            cfg.driver_name,
            taints=noisy_taints.merged(watcher.taints, noisy_on_gpus.taints),
            layout=layout,
            on_write=lambda verb: metrics.slice_writes.labels(verb).inc(),
        )

        def on_change(inventory: object) -> None:
            del inventory
            wake.set()

        state.on_inventory_change = on_change
        recovered = threading.Event()  # the offer's watch re-reads the GPUs only once recovery is done

        def offer_changed() -> None:
            if recovered.is_set():
                state.rediscover()  # a changed inventory wakes the publisher (on_change)

        offers = OfferWatch(api_client, cfg.node_name, offer_changed) if cfg.mig_offer else None
        if offers is not None:  # else --mig-placements=all: every GPU's placements, the offer not read
            state.mig_offer = offers.current
            try:
                offers.read_once()
            except Exception as exc:  # no offer read: every GPU's MIG placements, until the watch reads one
                log.warning("could not read the MIG offer; offering MIG on every GPU for now", error=str(exc)[:300])
        log.info("recovering state", node=cfg.node_name, backend=cfg.backend)
        state.recover()
        recovered.set()
        if offers is not None:
            offers.start()
        watcher.start()
        publisher.publish(state.inventory())
        metrics.devices_published.set(publisher.devices_published)
        published.set()

        reporter = ClaimStatusReporter(
            state.snapshot,
            lambda ns, name, uid, devices: api.write_claim_device_status(
                ns, name, uid, devices, driver=cfg.driver_name, node=cfg.node_name
            ),
            cfg.driver_name,
        )
        if cfg.claim_device_status:
            reporter.start()
        server = PluginServer(
            cfg.driver_name,
            reporter.wrap(state) if cfg.claim_device_status else state,
            registry_dir=cfg.registry_dir,
            plugin_dir=cfg.plugin_dir,
            instance=cfg.plugin_instance,
            health_source=board,
            timing=metrics.rpc,
        )
        server.start()
        if imex_daemons is not None:
            imex_daemons.start()
        checks.add_check("kubelet-registered", server.registered.is_set)
        telemetry_metrics = TelemetryMetrics(metrics.registry)
        sampler = telemetry.TelemetrySampler(
            backend,
            telemetry.TelemetrySettings(
                interval_s=cfg.telemetry_interval_s,
                hostname=cfg.node_name,
                noisy=noisy_settings,
            ),
            telemetry_metrics,
            inventory=state.inventory,
            checkpoint=state.snapshot,
            tiers=TierResolver(api),
            daemon_pids=lambda: {d.pid: d.claim_uid for d in mps.list_daemons() if d.pid is not None},
            events=api,
            accountant=cost.CostAccountant(
                cfg.cost_ledger_path,
                cfg.node_name,
                flush_interval_s=cfg.cost_flush_interval_s,
                sink=telemetry_metrics,
            ),
        )
        alerts.append(sampler.noisy.detector.active)
        sampler.start()
        log.info(
            "driver ready",
            registration_socket=str(server.registration_socket),
            dra_socket=str(server.dra_socket),
            devices=publisher.devices_published,
        )
        next_publish = time.monotonic() + cfg.republish_interval_s
        next_cleanup = time.monotonic() + cfg.cleanup_interval_s
        checks.watch([MAIN_LOOP, HEALTH_LOOP])
        try:
            while not stop.is_set():
                checks.beat(MAIN_LOOP)
                wake.wait(timeout=1.0)
                if noisy_on_gpus.refresh():  # a noisy-neighbour alert raised or cleared: republish now
                    wake.set()
                now = time.monotonic()
                due = now >= next_publish
                if wake.is_set() or due:
                    wake.clear()
                    try:
                        # A wake-up comes from a fresh discovery (inventory changed) or from new taints:
                        # only the periodic tick needs to re-read the hardware, and any publish while MIG
                        # instances are owed (a GPU back on the bus is offered only once they are destroyed).
                        inventory = state.rediscover() if due or state.owing else state.inventory()
                    except Exception:
                        log.exception("re-reading the GPUs failed; publishing the last known inventory")
                        inventory = state.inventory()
                    try:
                        # On the periodic tick compare with the API too, not only with what was last written:
                        # kubelet deletes the node's ResourceSlices when it (re)starts (and ~30 s after a driver
                        # vanished), while this driver keeps running with nothing changed.
                        publisher.publish(inventory, force=due)
                        metrics.devices_published.set(publisher.devices_published)
                    except Exception:
                        log.exception("publishing ResourceSlices failed; retrying on the next tick")
                    if due:
                        next_publish = now + cfg.republish_interval_s
                if now >= next_cleanup:
                    try:
                        state.cleanup()
                    except Exception:
                        log.exception("periodic cleanup failed; retrying on the next tick")
                    next_cleanup = now + cfg.cleanup_interval_s
        finally:
            log.info("driver stopping", signalled=stop.is_set())
            sampler.stop()
            watcher.stop()
            if offers is not None:
                offers.stop()
            # Calls already running finish (an MPS prepare waits for its daemon pod): kubelet sends no
            # new ones once registration is withdrawn, and the DaemonSet gives the pod 30 s in all.
            server.stop(grace=SHUTDOWN_GRACE_S)
            if imex_daemons is not None:
                imex_daemons.stop()
            reporter.stop()
            for endpoint in http:
                endpoint.stop()
            log.info("driver stopped")
        return 0
    finally:
        backend.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_mod.parse_args(argv)
    logs.configure(cfg.log_level, cfg.log_format)
    stop = threading.Event()

    def _signal(signum: int, frame: FrameType | None) -> None:
        # No logging here: a handler runs on the main thread between two bytecodes, maybe mid-write.
        # The main loop only reads the flag (is_set takes no lock), and logs "driver stopping".
        del signum, frame
        stop.set()

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    return run(cfg, stop)


if __name__ == "__main__":
    raise SystemExit(main())
