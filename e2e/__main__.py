"""``python -m e2e``: build the control-plane binaries, bring a cluster up, take it down, run the demo.

    python -m e2e build      # Kubernetes binaries, kubelet and containerd, then JobSet and LeaderWorkerSet
    python -m e2e images
    python -m e2e helm
    python -m e2e up [--state-dir DIR] [--nodes hgx-h100:2,gb200-nvl72:2,a100-40gb:1] [--real-nodes hgx-h100:1]
                     [--controllers 2] [--addons jobset,lws]
    python -m e2e down [--state-dir DIR]
    python -m e2e status [--state-dir DIR]
    python -m e2e demo [--state-dir DIR] [--nodes SPEC] [--controllers N] [--with-example DIR]

``up`` leaves the components running after it exits (each in its own
session, tracked by pidfiles in the state directory): the control plane;
gpuplane installed with ``kubectl apply -k manifests/overlays/e2e`` (everything
in ``manifests/``, its DaemonSet and Deployment pinned off the simulated nodes,
which have no container runtime); the real nodes of ``--real-nodes`` (a real kubelet
and containerd each, see ``e2e.plane.realnode``; ``up`` starts none unless asked, ``demo``
one ``hgx-h100`` where the machine allows it); the simulated GPU nodes of ``--nodes``
(default ``e2e.plane.simnodes.DEFAULT_NODE_SPEC``; ``--nodes ''`` for none), each a
``gpuplane-driver`` under the ``gpuplane-driver`` ServiceAccount (a token bound
to a pod on its node) plus a kubelet stand-in; and ``--controllers`` (default 2)
``gpuplane-controller`` replicas under the ``gpuplane-controller``
ServiceAccount, electing a leader on a Lease (see ``e2e.plane.components``; the tokens
last 24 h); and the workload controllers of ``--addons`` (default ``jobset,lws``: JobSet
and LeaderWorkerSet built from their Go modules, see ``e2e.cluster.addons``). It prints
``KUBECONFIG=<path>`` as its last line. ``demo`` (``scripts/demo.sh``) brings the
same cluster up (or reuses it), applies every scenario in ``manifests/examples``
and prints where each pod landed. The state directory defaults to
``$GPUPLANE_STATE`` or ``~/.local/state/gpuplane/e2e``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from e2e.cluster import addon_build, addons, build, controlplane, procs
from e2e.plane import bringup, components, demo, identity, nodes, podinstall, simnodes
from e2e.plane.realnode import cli as realnodes

Printer = Callable[[str], None]
DEFAULT_ADDONS = bringup.DEFAULT_ADDONS


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """``$GPUPLANE_STATE`` or ``~/.local/state/gpuplane/e2e``."""
    configured = environ.get("GPUPLANE_STATE")
    return Path(configured).expanduser() if configured else Path.home() / ".local" / "state" / "gpuplane" / "e2e"


def _say(message: str) -> None:
    print(message, flush=True)


def cmd_build(args: argparse.Namespace, out: Printer) -> int:
    """Build (or find cached) binaries."""
    bins = build.ensure_binaries(out=out)
    out(f"binaries ready in {bins.directory}")
    node_bins = realnodes.ensure_binaries(out=out)
    out(f"real-node binaries ready: {', '.join(str(p) for p in node_bins.all())}")
    for name in addon_build.RECIPES:
        built = addon_build.ensure_addon(name, out=out)
        out(f"{name} {built.version} ready in {built.directory}")
    return 0


def cmd_images(args: argparse.Namespace, out: Printer) -> int:
    """Build (or find cached) the driver and controller images from their Dockerfiles (e2e.images)."""
    from e2e.images import build as images

    started = time.monotonic()
    built = images.ensure_images(out=out)
    for image in built:
        state = "cached" if image.cached else f"built in {image.seconds:.1f}s"
        out(
            f"{image.ref:40} {state:18} {image.sizes.uncompressed / 1e6:6.0f} MB unpacked "
            f"{image.sizes.compressed / 1e6:6.0f} MB compressed  {image.archive}"
        )
    out(f"images ready in {time.monotonic() - started:.1f}s")
    return 0


def cmd_helm(args: argparse.Namespace, out: Printer) -> int:
    """Build (or find cached) helm from its Go module (e2e.plane.helm)."""
    from e2e.plane import helm

    out(f"helm ready: {helm.ensure_helm(out=out)}")
    return 0


def bring_up_from_args(args: argparse.Namespace, out: Printer) -> tuple[Path, Path]:
    """``bring_up`` as ``up`` and ``demo`` ask for it: the state directory and the admin kubeconfig."""
    state_dir: Path = args.state_dir.resolve()
    real = realnodes.resolve(args.real_nodes, out)
    kubeconfig = bringup.bring_up(
        state_dir,
        nodes.parse_node_spec(args.nodes or ""),
        out,
        controllers=args.controllers,
        addon_names=bringup.parse_addons(args.addons),
        real_groups=real,
    )
    return state_dir, kubeconfig


def cmd_up(args: argparse.Namespace, out: Printer) -> int:
    """Start the control plane and the simulated nodes and leave them running."""
    _, kubeconfig = bring_up_from_args(args, out)
    out(f"KUBECONFIG={kubeconfig}")
    return 0


def cmd_demo(args: argparse.Namespace, out: Printer) -> int:
    """The main job: cluster up (or reused), gpuplane installed, every example applied, a table of results."""
    state_dir, kubeconfig = bring_up_from_args(args, out)
    return demo.run(state_dir, kubeconfig, out=out, timeout=args.timeout, extra_examples=args.with_example)


def cmd_down(args: argparse.Namespace, out: Printer) -> int:
    """Stop everything recorded in the state directory."""
    state_dir: Path = args.state_dir.resolve()
    stopped = bringup.stop_all(state_dir, out)
    out(f"stopped {', '.join(stopped)}" if stopped else f"nothing running in {state_dir}")
    return 0


def cmd_status(args: argparse.Namespace, out: Printer) -> int:
    """Show which components run; exit 1 unless all do."""
    state_dir: Path = args.state_dir.resolve()
    records = procs.read_records(state_dir / "pids")
    for name in controlplane.COMPONENTS:
        record = records.get(name)
        state = "running" if record and procs.is_alive(record) else "stopped"
        out(f"{name:25} {state}" + (f" (pid {record.pid}, log {record.log})" if record else ""))
    all_alive = True
    node_processes = [(n.driver_process, n.kubelet_process) for n in simnodes.load_nodes(state_dir)]
    as_pods = podinstall.recorded(state_dir)
    if as_pods is not None:
        out(
            f"{'gpuplane':25} installed as pods ({as_pods['kustomization']}) on {', '.join(as_pods['real_nodes'])}: "
            f"kubectl get pods -n {identity.NAMESPACE} -o wide"
        )
    for names in [*realnodes.process_names(state_dir, host_driver=as_pods is None), *node_processes]:
        for name in names:
            record = records.get(name)
            alive = record is not None and procs.is_alive(record)
            all_alive = all_alive and alive
            out(
                f"{name:25} {'running' if alive else 'stopped'}"
                + (f" (pid {record.pid}, log {record.log})" if record else "")
            )
    for name, record in sorted(components.controller_records(state_dir).items()):
        alive = procs.is_alive(record)
        all_alive = all_alive and alive
        out(f"{name:25} {'running' if alive else 'stopped'} (pid {record.pid}, log {record.log})")
    for name, record in sorted(records.items()):
        if name.startswith(addons.PROCESS_PREFIX):
            alive = procs.is_alive(record)
            all_alive = all_alive and alive
            out(f"{name:25} {'running' if alive else 'stopped'} (pid {record.pid}, log {record.log})")
    all_up = set(controlplane.COMPONENTS) <= set(controlplane.running(state_dir)) and all_alive
    if all_up:
        out(f"KUBECONFIG={state_dir / 'kubeconfig'}")
    return 0 if all_up else 1


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The argument parser."""
    top = argparse.ArgumentParser(prog="python -m e2e", description=__doc__.split("\n")[0] if __doc__ else None)
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "build", help="build the control-plane, real-node binaries and the workload controllers into the cache"
    ).set_defaults(func=cmd_build)
    sub.add_parser(
        "images", help="build the driver and controller images from their Dockerfiles (buildah) into the cache"
    ).set_defaults(func=cmd_images)
    sub.add_parser("helm", help="build helm from its Go module into the cache").set_defaults(func=cmd_helm)
    state_help = "state directory (default: $GPUPLANE_STATE or ~/.local/state/gpuplane/e2e)"
    nodes_help = f"simulated GPU nodes, PROFILE[:COUNT],... ('' for none; default {simnodes.DEFAULT_NODE_SPEC})"
    known = ", ".join(addon_build.RECIPES)
    addons_help = f"workload controllers to build and run, comma-separated ('' for none; known: {known})"
    controllers_help = f"gpuplane-controller replicas (default {components.DEFAULT_REPLICAS}; 0 for none)"
    up = sub.add_parser("up", help="start a control plane with simulated GPU nodes and leave it running")
    up.add_argument("--state-dir", type=Path, default=default_state_dir(environ), help=state_help)
    up.add_argument("--nodes", default=simnodes.DEFAULT_NODE_SPEC, help=nodes_help)
    up.add_argument("--real-nodes", default="", help=realnodes.HELP + " (default '')")
    up.add_argument("--controllers", type=int, default=components.DEFAULT_REPLICAS, help=controllers_help)
    up.add_argument("--addons", default=",".join(DEFAULT_ADDONS), help=addons_help)
    up.set_defaults(func=cmd_up)
    run_demo = sub.add_parser("demo", help="cluster up, gpuplane installed, every example applied, results shown")
    run_demo.add_argument("--state-dir", type=Path, default=default_state_dir(environ), help=state_help)
    run_demo.add_argument("--nodes", default=simnodes.DEFAULT_NODE_SPEC, help=nodes_help)
    run_demo.add_argument("--real-nodes", default=realnodes.AUTO, help=realnodes.HELP + f" (default {realnodes.AUTO})")
    run_demo.add_argument("--controllers", type=int, default=components.DEFAULT_REPLICAS, help=controllers_help)
    run_demo.add_argument("--addons", default=",".join(DEFAULT_ADDONS), help=addons_help)
    run_demo.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the example pods")
    run_demo.add_argument(
        "--with-example",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of YAML to apply with the examples and judge like them: all its pods must run (repeatable)",
    )
    run_demo.set_defaults(func=cmd_demo)
    for name, func, text in (
        ("down", cmd_down, "stop the control plane"),
        ("status", cmd_status, "show which components run"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--state-dir", type=Path, default=default_state_dir(environ), help=state_help)
        command.set_defaults(func=func)
    return top


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = parser(os.environ).parse_args(argv)
    # Turn SIGTERM into an exception so a half-started control plane is stopped.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code: int = args.func(args, _say)
    except (build.BuildError, procs.ComponentError, FileNotFoundError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
