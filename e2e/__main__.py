"""``python -m e2e``: build the control-plane binaries, bring a cluster up, take it down.

    python -m e2e build
    python -m e2e up [--state-dir DIR] [--nodes hgx-h100:2,gb200-nvl72:4]
    python -m e2e down [--state-dir DIR]
    python -m e2e status [--state-dir DIR]

``up`` leaves the components running after it exits (each in its own
session, tracked by pidfiles in the state directory) and prints
``KUBECONFIG=<path>`` as its last line. The state directory defaults to
``$GPUPLANE_STATE`` or ``~/.local/state/gpuplane/e2e``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from e2e import build, controlplane, nodes, procs

Printer = Callable[[str], None]


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """``$GPUPLANE_STATE`` or ``~/.local/state/gpuplane/e2e``."""
    configured = environ.get("GPUPLANE_STATE")
    return Path(configured).expanduser() if configured else Path.home() / ".local" / "state" / "gpuplane" / "e2e"


def _say(message: str) -> None:
    print(message, flush=True)


def start_nodes(state_dir: Path, kubeconfig: Path, groups: Sequence[nodes.NodeGroup], out: Printer) -> None:
    """The ``nodes`` step of ``up``: simulated GPU nodes (not implemented yet; the spec is recorded)."""
    if groups:
        described = ", ".join(f"{g.count}x {g.profile}" for g in groups)
        out(f"nodes: requested {described}; node simulation is not implemented yet (spec kept in cluster.json)")


def cmd_build(args: argparse.Namespace, out: Printer) -> int:
    """Build (or find cached) binaries."""
    bins = build.ensure_binaries(out=out)
    out(f"binaries ready in {bins.directory}")
    return 0


def cmd_up(args: argparse.Namespace, out: Printer) -> int:
    """Start the control plane (and, later, nodes) and leave it running."""
    state_dir: Path = args.state_dir.resolve()
    groups = nodes.parse_node_spec(args.nodes or "")
    alive = controlplane.running(state_dir)
    if alive and set(alive) == set(controlplane.COMPONENTS):
        out(f"control plane in {state_dir} is already running (`python -m e2e down` to stop it)")
        out(f"KUBECONFIG={state_dir / 'kubeconfig'}")
        return 0
    if alive:
        out(f"stopping the remains of a previous control plane in {state_dir}: {', '.join(sorted(alive))}")
        controlplane.stop_state_dir(state_dir, out=out)
    started = time.monotonic()
    out("step 1/3: binaries")
    bins = build.ensure_binaries(out=out)
    out(f"step 2/3: control plane (state in {state_dir})")
    plane = controlplane.ControlPlane(state_dir, bins, out=out)
    kubeconfig = plane.start()
    try:
        info = {
            "server": plane.server,
            "kubeconfig": str(kubeconfig),
            "bins": str(bins.directory),
            "nodes": [{"profile": g.profile, "count": g.count} for g in groups],
            "feature_gates": plane.feature_gates,
            "runtime_config": plane.runtime_config,
        }
        (state_dir / "cluster.json").write_text(json.dumps(info, indent=2) + "\n")
        out("step 3/3: nodes")
        start_nodes(state_dir, kubeconfig, groups, out)
    except BaseException:
        plane.stop()
        raise
    plane.detach()
    out(f"cluster up in {time.monotonic() - started:.1f}s; stop it with `python -m e2e down --state-dir {state_dir}`")
    out(f"KUBECONFIG={kubeconfig}")
    return 0


def cmd_down(args: argparse.Namespace, out: Printer) -> int:
    """Stop everything recorded in the state directory."""
    state_dir: Path = args.state_dir.resolve()
    stopped = controlplane.stop_state_dir(state_dir, out=out)
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
    all_up = set(controlplane.running(state_dir)) == set(controlplane.COMPONENTS)
    if all_up:
        out(f"KUBECONFIG={state_dir / 'kubeconfig'}")
    return 0 if all_up else 1


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The argument parser."""
    top = argparse.ArgumentParser(prog="python -m e2e", description=__doc__.split("\n")[0] if __doc__ else None)
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the control-plane binaries into the cache").set_defaults(func=cmd_build)
    state_help = "state directory (default: $GPUPLANE_STATE or ~/.local/state/gpuplane/e2e)"
    up = sub.add_parser("up", help="start a control plane and leave it running")
    up.add_argument("--state-dir", type=Path, default=default_state_dir(environ), help=state_help)
    up.add_argument("--nodes", default="", help="simulated nodes, e.g. hgx-h100:2,gb200-nvl72:4")
    up.set_defaults(func=cmd_up)
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
