"""A node driver in its own process, for crash tests and the benchmark: production code on the simulator.

Run ``python -m tests.crash_worker --root DIR``. It builds the production
:class:`~gpuplane.driver.prepare.state.DeviceState` on the file-backed simulator (state under
``DIR/sim``, so MIG instances outlive this process like hardware), a
file-backed :class:`~testing.driverkit.FakeClaims` (``DIR/claims.json``) or the
real API (``--kubeconfig``), and the MPS manager with the stand-in binary;
runs ``state.recover()`` as ``gpuplane-driver`` does at start; serves the real
kubelet sockets (:class:`~gpuplane.driver.plugin.server.PluginServer`); prints one JSON
line ``{"ready": true, "pid": ..., "recover": {...}, "registration_socket": ...}``
and serves until SIGTERM.

Fault injection: after start-up, every step the state machine reports through
its fault hook is appended to ``DIR/steps.log`` (``<pid> <step>``). If the file
``DIR/kill-at`` exists and holds ``{"step": "prepare:gi-created", "nth": 2}``,
the process SIGKILLs itself at the nth occurrence of that step (counted from
when that content was first seen). Recovery at start-up is never interrupted:
the hook is armed only once the sockets serve.

SIGUSR1 writes ``DIR/stats-<pid>.json``: simulator time (``sim_time_s``, includes
its ``op_latency_s``), time inside the MPS manager's start/stop (``mps_time_s``)
and the process's resident memory (``rss_kib``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from gpuplane import logs
from gpuplane.api import names
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.kube import KubeApi, make_api_client
from gpuplane.driver.plugin.server import PluginServer
from gpuplane.driver.prepare.contract import ClaimRef, PrepareResult, UnprepareResult
from gpuplane.driver.prepare.state import ClaimSource, DeviceState
from gpuplane.driver.sharing.mps import MpsControl
from gpuplane.driver.sharing.mps_spec import MpsDaemon, MpsSpec
from testing.driverkit import STANDIN_MPS, FakeClaims, state_settings


class _TimedMps(MpsControl):
    """The production MPS manager, timing what it spends starting and stopping daemons."""

    spent_s = 0.0

    def start(self, spec: MpsSpec) -> MpsDaemon:
        t0 = time.perf_counter()
        try:
            return super().start(spec)
        finally:
            self.spent_s += time.perf_counter() - t0

    def stop(self, claim_uid: str) -> None:
        t0 = time.perf_counter()
        try:
            super().stop(claim_uid)
        finally:
            self.spent_s += time.perf_counter() - t0


class FaultHook:
    """Records each step; SIGKILLs this process at the armed step."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.armed = False
        self._seen = ""
        self._counts: dict[str, int] = {}
        self._log = os.open(root / "steps.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, step: str) -> None:
        if not self.armed:
            return
        os.write(self._log, f"{os.getpid()} {step}\n".encode())
        try:
            raw = (self.root / "kill-at").read_text()
        except FileNotFoundError:
            return
        if raw != self._seen:
            self._seen, self._counts = raw, {}
        target = json.loads(raw)
        self._counts[step] = self._counts.get(step, 0) + 1
        if step == target["step"] and self._counts[step] == int(target.get("nth", 1)):
            os.kill(os.getpid(), signal.SIGKILL)


class _Noop:
    """A preparer that does nothing: what is left of a call is the gRPC transport."""

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        return {c.uid: PrepareResult() for c in claims}

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        return {c.uid: UnprepareResult() for c in claims}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--profile", default="hgx-h100")
    parser.add_argument("--node", default="node-a")
    parser.add_argument("--instance", default="", help="plugin instance name (two plugin pods on one node)")
    parser.add_argument("--op-latency", type=float, default=0.0, help="simulated NVML latency per MIG op")
    parser.add_argument("--kubeconfig", default=None, help="read claims from this API server")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--noop-plugin", action="store_true", help="also serve a plugin that does nothing (gRPC transport cost)"
    )
    parser.add_argument(
        "--full-imports", action="store_true", help="also load what gpuplane-driver loads (for memory figures)"
    )
    args = parser.parse_args(argv)
    if args.full_imports:
        import gpuplane.driver.main  # noqa: F401
    root: Path = args.root.absolute()
    logs.configure(args.log_level, "json")

    sim = Simulator(
        SimConfig(profile=args.profile, state_dir=root / "sim", node_name=args.node, op_latency_s=args.op_latency)
    )
    sim.init()
    claims: ClaimSource = (
        KubeApi(make_api_client(args.kubeconfig)) if args.kubeconfig else FakeClaims(root / "claims.json")
    )
    mps = _TimedMps(root / "p" / "mps", STANDIN_MPS)
    hook = FaultHook(root)
    state = DeviceState(state_settings(root, args.node, sim.boot_id()), sim, claims, mps, fault_hook=hook)
    stats = state.recover()
    suffix = f"-{args.instance}" if args.instance else ""
    server = PluginServer(
        names.DRIVER_NAME, state, registry_dir=root / f"reg{suffix}", plugin_dir=root / f"plug{suffix}"
    )
    server.start()
    hook.armed = True
    noop = PluginServer(names.DRIVER_NAME, _Noop(), registry_dir=root / "reg-noop", plugin_dir=root / "plug-noop")
    if args.noop_plugin:
        noop.start()

    stop = threading.Event()

    def _term(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    def _stats(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        doc: dict[str, Any] = {
            "sim_time_s": sim.sim_time_s,
            "mps_time_s": mps.spent_s,
            "rss_kib": rss_kib(os.getpid()),
        }
        out = root / f"stats-{os.getpid()}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, out)

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    signal.signal(signal.SIGUSR1, _stats)
    ready = {
        "ready": True,
        "pid": os.getpid(),
        "recover": stats,
        "registration_socket": str(server.registration_socket),
        "boot_id": sim.boot_id(),
        "noop_registration_socket": str(noop.registration_socket) if args.noop_plugin else None,
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    try:
        while not stop.is_set():  # not stop.wait(): _term sets it on this thread, maybe mid-wait
            time.sleep(0.2)
    finally:
        server.stop(grace=2.0)
        if args.noop_plugin:
            noop.stop(grace=0)
        sim.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
