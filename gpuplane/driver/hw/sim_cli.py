"""Command line for poking a running simulator from outside.

Usage: ``python -m gpuplane.driver.hw.sim_cli --state-dir DIR <cmd>``.

Tests and the e2e harness use it to inject faults, processes and telemetry, or to make MIG instances
behind the driver's back. It builds a :class:`~gpuplane.driver.hw.sim.Simulator` on the same state dir (the
configuration is read from the state file, where the driver's simulator recorded it, or from
``--config``) and calls the same methods; output is JSON on stdout. Exit status 2 on a hardware
error, with ``{"error": code, "message": ...}`` printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuplane.driver.hw.interface import HardwareError, HealthEventKind
from gpuplane.driver.hw.sim import STATE_FILE, SimConfig, Simulator


def _load_config(state_dir: Path, config_file: str | None) -> SimConfig:
    if config_file:
        return SimConfig.from_file(config_file, state_dir=str(state_dir))
    try:
        stored = json.loads((state_dir / STATE_FILE).read_text())["config"]
    except (FileNotFoundError, KeyError) as e:
        raise SystemExit(f"no simulator state with a recorded config in {state_dir}; pass --config FILE") from e
    stored["state_dir"] = str(state_dir)
    return SimConfig.model_validate(stored)


def _parse_value(text: str) -> Any:
    """A telemetry value: JSON when it parses, "pid:frac,pid:frac" for per-process maps, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    if ":" in text:
        return {int(k): float(v) for k, v in (kv.split(":", 1) for kv in text.split(","))}
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpuplane.driver.hw.sim_cli", description=__doc__)
    p.add_argument("--state-dir", required=True, type=Path)
    p.add_argument("--config", help="SimConfig YAML/JSON, when the state dir has none recorded yet")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("show", help="dump the state as JSON")
    sub.add_parser("gpus", help="list the enumerated GPUs")
    x = sub.add_parser("inject-xid")
    x.add_argument("--uuid", required=True)
    x.add_argument("--xid", required=True, type=int)
    x.add_argument("--message", default="")
    e = sub.add_parser("inject-event")
    e.add_argument("--uuid", required=True)
    e.add_argument("--kind", required=True, choices=[k.value for k in HealthEventKind])
    e.add_argument("--xid", type=int, default=0)
    e.add_argument("--message", default="")
    t = sub.add_parser("set-telemetry", help="KEY=VALUE ... (e.g. sm_active=0.9 per_process_bandwidth=12:0.4)")
    t.add_argument("--uuid", required=True)
    t.add_argument("pairs", nargs="+", metavar="KEY=VALUE")
    a = sub.add_parser("add-process")
    a.add_argument("--uuid", required=True)
    a.add_argument("--pid", required=True, type=int)
    a.add_argument("--mem", required=True, type=int, help="bytes")
    c = sub.add_parser("clear-processes")
    c.add_argument("--uuid")
    g = sub.add_parser("create-gi", help="admin-made MIG instance (with its full compute instance)")
    g.add_argument("--uuid", required=True)
    g.add_argument("--profile", required=True, help="profile name (3g.40gb) or NVML GI profile constant")
    g.add_argument("--placement", required=True, type=int)
    g.add_argument("--no-ci", action="store_true", help="create the GPU instance only")
    d = sub.add_parser("destroy-gi", help="destroy a GI and its compute instances")
    d.add_argument("--uuid", required=True)
    d.add_argument("--gi", required=True, type=int)
    m = sub.add_parser("set-mig")
    m.add_argument("--uuid", required=True)
    m.add_argument("--enabled", required=True, choices=["true", "false"])
    r = sub.add_parser("reset-gpu")
    r.add_argument("--uuid", required=True)
    b = sub.add_parser("back-on-bus", help="a lost GPU answers again without a reset (its MIG instances kept)")
    b.add_argument("--uuid", required=True)
    sub.add_parser("reboot")
    return p


def _profile_id(sim: Simulator, uuid: str, text: str) -> int:
    if text.isdigit():
        return int(text)
    model = sim.profile.gpu.mig_model
    prof = None if model is None else model.profile_by_name(text)
    if prof is None:
        raise SystemExit(f"unknown MIG profile {text!r} for {sim.profile.gpu.product_name} ({uuid})")
    return prof.profile_id


def run(argv: Sequence[str], sim: Simulator | None = None) -> Any:
    """Execute one command; returns the JSON-able result (raises HardwareError on a refused call)."""
    args = _parser().parse_args(argv)
    if sim is None:
        sim = Simulator(_load_config(args.state_dir, args.config))
    with sim:
        cmd = args.cmd
        if cmd == "show":
            return sim.dump_state()
        if cmd == "gpus":
            return [asdict(g) for g in sim.gpus()]
        if cmd == "inject-xid":
            return asdict(sim.inject_event(args.uuid, HealthEventKind.XID, xid=args.xid, message=args.message))
        if cmd == "inject-event":
            return asdict(sim.inject_event(args.uuid, args.kind, xid=args.xid, message=args.message))
        if cmd == "set-telemetry":
            overrides = {}
            for pair in args.pairs:
                key, _, value = pair.partition("=")
                overrides[key] = _parse_value(value)
            sim.set_telemetry(args.uuid, overrides)
            return asdict(sim.sample(args.uuid))
        if cmd == "add-process":
            sim.add_process(args.uuid, args.pid, args.mem)
            return {"ok": True}
        if cmd == "clear-processes":
            sim.clear_processes(args.uuid)
            return {"ok": True}
        if cmd == "create-gi":
            gi = sim.create_gpu_instance(args.uuid, _profile_id(sim, args.uuid, args.profile), args.placement)
            if not args.no_ci:
                gi = sim.create_compute_instance(args.uuid, gi.gi_id)
            return asdict(gi)
        if cmd == "destroy-gi":
            for gi in sim.gpu_instances(args.uuid):
                if gi.gi_id == args.gi:
                    for ci in gi.compute_instances:
                        sim.destroy_compute_instance(args.uuid, gi.gi_id, ci.ci_id)
            sim.destroy_gpu_instance(args.uuid, args.gi)
            return {"ok": True}
        if cmd == "set-mig":
            return asdict(sim.set_mig_mode(args.uuid, args.enabled == "true"))
        if cmd == "reset-gpu":
            return asdict(sim.reset_gpu(args.uuid))
        if cmd == "back-on-bus":
            sim.back_on_bus(args.uuid)
            return {"ok": True}
        if cmd == "reboot":
            return {"boot_id": sim.reboot()}
        raise SystemExit(f"unknown command {cmd}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        result = run(sys.argv[1:] if argv is None else argv)
    except HardwareError as e:
        print(json.dumps({"error": e.code.value, "message": e.message}))
        return 2
    print(json.dumps(result, indent=1, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
