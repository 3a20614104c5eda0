"""The IMEX daemon pod's entry point: runs ``nvidia-imex`` and sends it ``SIGUSR1`` when its node file changes.

``python3 -m gpuplane.driver.sharing.imex_watch --nodes=<node file> -- <imex binary> -c <config>``
(:func:`.imex_pods.daemon_pod`). The driver, in another pod, rewrites the node file (atomically) when the
domain's nodes change; this watcher, in the daemon's pod, reads it every ``--interval`` seconds and signals the
daemon on a change (the daemon re-reads its node file on ``SIGUSR1``, as NVIDIA's daemon pod does on a peer
change), so neither a PID namespace nor a signal crosses pods. It waits ``--settle`` seconds after the start
before any signal (``SIGUSR1``'s default action ends a daemon that has not installed its handler yet).
``SIGTERM``/``SIGINT`` are passed on and the watcher exits with the daemon's code; a daemon that exits ends
the watcher with its code, and kubelet starts the pod's container again (``restartPolicy: Always``).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType


def read(path: Path) -> bytes | None:
    """The node file's bytes (None: unreadable, e.g. between the driver's removal and the pod's end)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def should_signal(seen: bytes | None, now: bytes | None) -> bool:
    """A change worth a reload: the file is there and differs from what the daemon last read."""
    return now is not None and now != seen


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="imex_watch")
    p.add_argument("--nodes", required=True, type=Path, help="the node file the daemon reads")
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = list(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        p.error("no daemon command after --")
    seen = read(args.nodes)
    child = subprocess.Popen(command)
    started = time.monotonic()

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            return child.wait(timeout=args.interval)
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() - started < args.settle:
            continue
        now = read(args.nodes)
        if should_signal(seen, now):
            seen = now
            print(f"imex_watch: {args.nodes} changed; SIGUSR1 to pid {child.pid}", file=sys.stderr, flush=True)
            child.send_signal(signal.SIGUSR1)


if __name__ == "__main__":
    sys.exit(main())
