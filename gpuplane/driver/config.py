"""Driver configuration: read once at start (flags, then environment) and passed in."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuplane.api import names
from gpuplane.driver.plugin import socket_names
from gpuplane.httpauth import settings as serving
from gpuplane.placement.fragmentation import SizeMix


class DriverConfig(BaseModel):
    """Everything the node driver needs to know about its environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_name: str
    driver_name: str = names.DRIVER_NAME
    kubeconfig: str | None = None  # None: in-cluster service-account credentials
    backend: Literal["nvml", "sim"] = "nvml"
    sim_profile: str | None = None
    sim_state_dir: Path | None = None
    sim_config_file: Path | None = None
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugin_dir: Path = Path(f"/var/lib/kubelet/plugins/{names.DRIVER_NAME}")
    # The plugin pod's UID (downward API): the socket names carry it, so that an old and a new
    # pod can serve the node side by side during a rolling update (plugin/socket_names.py).
    plugin_instance: str = ""
    cdi_root: Path = Path("/var/run/cdi")
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    mps_control_binary: str = "nvidia-cuda-mps-control"
    # process: each claim's MPS control daemon is the driver's child (host processes, the kubelet
    # stand-in); pod: a Pod of its own on the node, which outlives the driver pod (the DaemonSet's
    # setting; needs POD_NAME and POD_NAMESPACE from the downward API and hostPID).
    mps_daemons: Literal["process", "pod"] = "process"
    mps_start_timeout_s: float = Field(default=10.0, gt=0)
    # off: no IMEX daemon (prepare waits for a domain's readiness only once some node reports it); process: this
    # node's nvidia-imex is the driver's child, and prepare waits until every node of a claim's domain reports
    # ready (gpuplane/driver/sharing/imex_runner.py, docs/imex.md).
    imex_daemons: Literal["off", "process", "pod"] = "off"
    imex_binary: str = "nvidia-imex"
    imex_ctl_binary: str = "nvidia-imex-ctl"
    imex_port: int = Field(default=50000, gt=0, lt=65536)
    # how long a claim labelled gpuplane.dev/imex-group waits for a domain to name it (docs/imex.md)
    imex_group_wait_s: float = Field(default=120.0, gt=0, le=3600)
    pod_name: str = ""
    pod_namespace: str = ""
    dev_root: Path = Path("/dev")  # where /dev/nvidia* live as the container runtime sees them
    metrics_address: str = ""  # "host:port" of /metrics (and the probes without health_address); empty: none
    health_address: str = ""  # "host:port" of /healthz and /readyz alone, plain HTTP without a token
    metrics_serving: serving.ServingSettings = serving.ServingSettings()  # HTTPS + token review, or loopback HTTP
    liveness_stale_after_s: float = Field(default=60.0, gt=0)  # /healthz fails when a loop stops this long
    republish_interval_s: float = 30.0
    cleanup_interval_s: float = 60.0
    health_poll_interval_s: float = 1.0
    taint_clear_after_s: float = 60.0
    benign_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    mig_placements: bool = True  # False: publish whole GPUs only, no MIG devices or counters
    mig_offer: bool = True  # follow the controller's MIG offer (docs/mig-offer.md); False: every GPU's placements
    claim_device_status: bool = True  # write what each claim got into its status.devices (KEP-4817)
    telemetry_interval_s: float = 10.0
    noisy_bandwidth_threshold: float = 0.5  # a claim's share of the GPU's memory bandwidth
    noisy_release_threshold: float = 0.4  # the alert clears below this (hysteresis)
    noisy_sustain_s: float = 30.0
    cost_flush_interval_s: float = 300.0
    # Steering the default scheduler (gpuplane.driver.publish.steering): publish each MIG profile's
    # placements in gpuplane's order for the node's state; taint the placements that strand compute.
    steer_order: bool = False
    withhold_stranding: bool = False
    steer_mix: str = ""  # the size mix the order ranks for ("3g=5.5,4g=13.7,1gpu=75"); empty: gpuplane's prior
    log_level: str = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"
    extra: dict[str, str] = Field(default_factory=dict)

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def lock_path(self) -> Path:
        return self.plugin_dir / "pu.lock"

    @property
    def cost_ledger_path(self) -> Path:
        return self.plugin_dir / "cost-ledger.jsonl"

    @property
    def mps_root(self) -> Path:
        return self.plugin_dir / "mps"


def _instance(p: argparse.ArgumentParser, value: str) -> str:
    try:
        return socket_names.check_instance(value.strip())
    except ValueError as err:
        p.error(str(err))
        raise  # p.error exits; this keeps the type checker content


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"GPUPLANE_{name}", default)


def parse_args(argv: Sequence[str] | None = None) -> DriverConfig:
    """Build the config from command-line flags with GPUPLANE_* environment fallbacks."""
    p = argparse.ArgumentParser(
        prog="gpuplane-driver",
        description="gpuplane node driver: a kubelet DRA plugin publishing and preparing GPUs.",
    )
    p.add_argument("--node-name", default=_env("NODE_NAME") or os.environ.get("NODE_NAME"))
    p.add_argument("--kubeconfig", default=_env("KUBECONFIG") or os.environ.get("KUBECONFIG"))
    p.add_argument("--backend", choices=["nvml", "sim"], default=_env("BACKEND", "nvml"))
    p.add_argument("--sim-profile", default=_env("SIM_PROFILE"))
    p.add_argument("--sim-state-dir", default=_env("SIM_STATE_DIR"))
    p.add_argument("--sim-config", default=_env("SIM_CONFIG"), help="YAML/JSON simulator config file")
    p.add_argument("--registry-dir", default=_env("REGISTRY_DIR", "/var/lib/kubelet/plugins_registry"))
    p.add_argument("--plugin-dir", default=_env("PLUGIN_DIR", f"/var/lib/kubelet/plugins/{names.DRIVER_NAME}"))
    p.add_argument("--cdi-root", default=_env("CDI_ROOT", "/var/run/cdi"))
    p.add_argument(
        "--plugin-instance",
        default=_env("PLUGIN_INSTANCE") or os.environ.get("POD_UID", ""),
        help="a name unique to this plugin process on the node (the DaemonSet passes its pod UID as POD_UID); "
        "it goes into the socket names so that two plugin pods can overlap during a rolling update",
    )
    p.add_argument("--boot-id-file", default=_env("BOOT_ID_FILE", "/proc/sys/kernel/random/boot_id"))
    p.add_argument("--mps-control-binary", default=_env("MPS_CONTROL_BINARY", "nvidia-cuda-mps-control"))
    p.add_argument(
        "--mps-daemons",
        choices=["process", "pod"],
        default=_env("MPS_DAEMONS", "process"),
        help="where each MPS claim's control daemon runs: process (the driver's child) or pod "
        "(a pod of its own on the node, which outlives the driver pod; needs POD_NAME and POD_NAMESPACE)",
    )
    p.add_argument(
        "--mps-start-timeout",
        type=float,
        default=None,
        help="seconds an MPS control daemon may take to answer (default 10; 60 with --mps-daemons=pod)",
    )
    p.add_argument(
        "--imex-daemons",
        choices=["off", "process", "pod"],
        default=_env("IMEX_DAEMONS", "off"),
        help="run this node's nvidia-imex for the ImexDomain listing it: off, process (the driver's child) or pod "
        "(a pod of its own on this node, outliving driver restarts); "
        "with a daemon, a claim's prepare waits until its IMEX domain is ready on every node",
    )
    p.add_argument("--imex-binary", default=_env("IMEX_BINARY", "nvidia-imex"))
    p.add_argument("--imex-ctl-binary", default=_env("IMEX_CTL_BINARY", "nvidia-imex-ctl"))
    p.add_argument("--imex-port", type=int, default=int(_env("IMEX_PORT", "50000") or 50000))
    p.add_argument(
        "--imex-group-wait",
        type=float,
        default=float(_env("IMEX_GROUP_WAIT", "120") or 120),
        help="seconds a claim labelled gpuplane.dev/imex-group waits for an IMEX domain to name it, then is "
        "prepared without a channel",
    )
    p.add_argument("--dev-root", default=_env("DEV_ROOT", "/dev"))
    p.add_argument(
        "--metrics-address",
        default=_env("METRICS_ADDRESS", ""),
        help="host:port of /metrics (HTTPS with a bearer token unless --metrics-auth=none); empty: no metrics",
    )
    p.add_argument(
        "--health-address",
        default=_env("HEALTH_ADDRESS", ""),
        help="host:port of /healthz and /readyz alone, plain HTTP without a token (kubelet's probes); "
        "empty: they are served beside /metrics",
    )
    serving.add_arguments(p, lambda name, default: _env(name, default) or default)
    p.add_argument(
        "--liveness-stale-after",
        type=float,
        default=float(_env("LIVENESS_STALE_AFTER", "60") or 60),
        help="seconds without a pass of a driver loop after which /healthz fails",
    )
    p.add_argument("--republish-interval", type=float, default=float(_env("REPUBLISH_INTERVAL", "30") or 30))
    p.add_argument("--cleanup-interval", type=float, default=float(_env("CLEANUP_INTERVAL", "60") or 60))
    p.add_argument("--taint-clear-after", type=float, default=float(_env("TAINT_CLEAR_AFTER", "60") or 60))
    p.add_argument("--health-poll-interval", type=float, default=float(_env("HEALTH_POLL_INTERVAL", "1") or 1))
    p.add_argument(
        "--benign-xids",
        default=_env("BENIGN_XIDS", "13,31,43,45,68,109"),
        help="comma-separated Xids that never taint a device (application errors)",
    )
    p.add_argument("--telemetry-interval", type=float, default=float(_env("TELEMETRY_INTERVAL", "10") or 10))
    p.add_argument("--noisy-threshold", type=float, default=float(_env("NOISY_THRESHOLD", "0.5") or 0.5))
    p.add_argument("--noisy-release", type=float, default=float(_env("NOISY_RELEASE", "0.4") or 0.4))
    p.add_argument("--noisy-sustain", type=float, default=float(_env("NOISY_SUSTAIN", "30") or 30))
    p.add_argument(
        "--steer-order",
        action="store_true",
        default=_env("STEER_ORDER") == "1",
        help="publish each MIG profile's placements in gpuplane's order of preference for the node's state",
    )
    p.add_argument(
        "--withhold-stranding",
        action="store_true",
        default=_env("WITHHOLD_STRANDING") == "1",
        help="taint the MIG placements that always strand compute (Hopper: 3g at slot 0, 1g.20gb at 0/2/4)",
    )
    p.add_argument(
        "--steer-mix",
        default=_env("STEER_MIX", ""),
        help="size mix the order ranks for, e.g. '1g=0.5,2g=4,3g=5.5,4g=13.7,1gpu=75' (default: a flat prior)",
    )
    p.add_argument(
        "--mig-placements",
        choices=["dynamic", "all", "off"],
        default=_env("MIG_PLACEMENTS", "dynamic"),
        help="dynamic: publish every MIG profile x placement (created at prepare) of the GPUs in the controller's "
        "MIG offer, in MIG mode or holding instances; all: of every GPU, whatever the offer (a node pool kept for "
        "MIG); off: publish whole GPUs only (208 -> 8 devices on an 8-GPU H100 node)",
    )
    p.add_argument(
        "--claim-device-status",
        choices=["on", "off"],
        default=_env("CLAIM_DEVICE_STATUS", "on"),
        help="on: write each prepared claim's devices (UUID, MIG profile, sharing, MPS pipe dir) into the "
        "ResourceClaim's status.devices (needs resourceclaims/driver associated-node:patch)",
    )
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"))
    p.add_argument("--log-format", choices=["auto", "json", "console"], default=_env("LOG_FORMAT", "auto"))
    args = p.parse_args(argv)
    if not args.node_name:
        p.error("--node-name (or NODE_NAME) is required: the driver publishes devices for exactly one node")
    if args.backend == "sim" and not (args.sim_profile or args.sim_config):
        p.error("--backend=sim needs --sim-profile (e.g. hgx-h100) or --sim-config FILE")
    pod_name, pod_namespace = os.environ.get("POD_NAME", ""), os.environ.get("POD_NAMESPACE", "")
    if args.mps_daemons == "pod" and not (pod_name and pod_namespace):
        p.error(
            "--mps-daemons=pod needs POD_NAME and POD_NAMESPACE (the downward API: metadata.name and "
            "metadata.namespace in the DaemonSet's env); outside a pod use --mps-daemons=process"
        )
    start_timeout = args.mps_start_timeout or (60.0 if args.mps_daemons == "pod" else 10.0)
    if start_timeout <= 0:
        p.error("--mps-start-timeout must be positive")
    metrics_serving = serving.from_arguments(p, args)
    if args.metrics_address:
        try:
            metrics_serving.check_bind(args.metrics_address.rpartition(":")[0].strip("[]"))
        except ValueError as exc:
            p.error(str(exc))
    try:
        SizeMix.parse(args.steer_mix)
    except ValueError as exc:
        p.error(f"--steer-mix: {exc}")
    return DriverConfig(
        node_name=args.node_name,
        kubeconfig=args.kubeconfig,
        backend=args.backend,
        sim_profile=args.sim_profile,
        sim_state_dir=Path(args.sim_state_dir) if args.sim_state_dir else None,
        sim_config_file=Path(args.sim_config) if args.sim_config else None,
        # Symlinks resolved: the sockets' paths must fit AF_UNIX's 107 bytes and be the host's paths.
        registry_dir=Path(args.registry_dir).resolve(),
        plugin_dir=Path(args.plugin_dir).resolve(),
        plugin_instance=_instance(p, args.plugin_instance),
        cdi_root=Path(args.cdi_root),
        boot_id_file=Path(args.boot_id_file),
        mps_control_binary=args.mps_control_binary,
        mps_daemons=args.mps_daemons,
        mps_start_timeout_s=start_timeout,
        imex_daemons=args.imex_daemons,
        imex_binary=args.imex_binary,
        imex_ctl_binary=args.imex_ctl_binary,
        imex_port=args.imex_port,
        imex_group_wait_s=args.imex_group_wait,
        pod_name=pod_name,
        pod_namespace=pod_namespace,
        dev_root=Path(args.dev_root),
        metrics_address=args.metrics_address,
        health_address=args.health_address,
        metrics_serving=metrics_serving,
        liveness_stale_after_s=args.liveness_stale_after,
        republish_interval_s=args.republish_interval,
        cleanup_interval_s=args.cleanup_interval,
        taint_clear_after_s=args.taint_clear_after,
        health_poll_interval_s=args.health_poll_interval,
        benign_xids=tuple(int(x) for x in str(args.benign_xids or "").split(",") if x.strip()),
        telemetry_interval_s=args.telemetry_interval,
        noisy_bandwidth_threshold=args.noisy_threshold,
        noisy_release_threshold=args.noisy_release,
        noisy_sustain_s=args.noisy_sustain,
        steer_order=args.steer_order,
        withhold_stranding=args.withhold_stranding,
        steer_mix=args.steer_mix,
        mig_placements=args.mig_placements != "off",
        mig_offer=args.mig_placements == "dynamic",
        claim_device_status=args.claim_device_status == "on",
        log_level=args.log_level,
        log_format=args.log_format,
    )
