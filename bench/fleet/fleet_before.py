"""Fleet benchmark: the code before the fleet-scale fixes, run beside the code after them in the same run.

* The controller: two follower replicas join the measured leader under the same Lease, one
  running the tree of ``--before REV`` (``git archive``; e.g. ``main`` before issue 17 landed)
  and one running this tree. A follower keeps every kopf index and reacts to every event but
  writes nothing, so the two differ only in what their indexes hold: their resident memory and
  CPU, read at the same moments, are the before/after of "index only what it reads".
* The publisher and the slice layout are switched per pass with ``FleetSlices.set_layout``
  (``in_place=False``: every change rewrites the pool at a new generation;
  ``counter_sets_per_slice=1``: one counter slice per GPU), see ``bench.fleet.fleet_scale``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bench.fleet import fleet_probe
from e2e.cluster import procs
from e2e.cluster.controlplane import free_port
from e2e.cluster.handle import Cluster
from e2e.plane import components, identity

REPO_ROOT = Path(__file__).resolve().parents[2]
FOLLOWERS = ("follower-before", "follower-after")  # pidfile names of the before and after followers


def extract(rev: str, dest: Path) -> str:
    """``git archive REV`` of this repository into ``dest``; returns the commit it names."""
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(REPO_ROOT), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {rev} failed (exit {archive.returncode})")
    return commit


@dataclasses.dataclass
class Followers:
    """The two follower replicas and what was read of them at each moment."""

    pids: dict[str, int]
    children: list[tuple[subprocess.Popen[bytes], procs.ProcessRecord]]
    rows: list[tuple[str, dict[str, tuple[float, float, float]]]] = dataclasses.field(default_factory=list)
    cpu0: dict[str, float] = dataclasses.field(default_factory=dict)

    def alive(self) -> None:
        """Raise, naming the follower and its log, when one has exited (its figures would read 0)."""
        for proc, record in self.children:
            if proc.poll() is not None:
                raise RuntimeError(f"controller follower {record.name} exited ({proc.returncode}); see {record.log}")

    def read(self, moment: str, peaks: fleet_probe.PeakSampler) -> None:
        """RSS now, peak RSS since the last read, CPU seconds since the start, for both."""
        self.alive()
        row: dict[str, tuple[float, float, float]] = {}
        for name, pid in self.pids.items():
            row[name] = (fleet_probe.rss_mb(pid), peaks.peak(name), fleet_probe.cpu_s(pid) - self.cpu0[name])
            peaks.reset(name)
        self.rows.append((moment, row))

    def settle(self, timeout: float, out: Callable[[str], None], window_s: float = 5.0) -> None:
        """Wait until both followers are idle (under 0.1 CPU seconds in ``window_s``): their indexes are full."""
        deadline = time.monotonic() + timeout
        last = {name: fleet_probe.cpu_s(pid) for name, pid in self.pids.items()}
        while time.monotonic() < deadline:
            time.sleep(window_s)
            self.alive()
            now = {name: fleet_probe.cpu_s(pid) for name, pid in self.pids.items()}
            busy = {name: now[name] - last[name] for name in now}
            last = now
            if all(b < 0.1 for b in busy.values()):
                return
            out("  followers indexing: " + ", ".join(f"{n} {b:.1f} CPU s/{window_s:.0f}s" for n, b in busy.items()))
        raise TimeoutError(f"controller followers still busy after {timeout:.0f}s")

    def stop(self) -> None:
        """Stop both followers."""
        for proc, record in self.children:
            procs.stop(record, proc)

    def table(self, before_commit: str) -> str:
        """Markdown: moment x (before, after) -> RSS, peak, CPU; and the after/before ratios."""
        b, a = FOLLOWERS
        out = [
            f"Before: the controller at {before_commit}; after: this tree. Both follow the leader (same Lease), "
            "so each keeps every index and handles every event, and neither writes.\n",
            "| moment | RSS MB before | RSS MB after | after/before | peak MB before | peak MB after | "
            "CPU s before | CPU s after | after/before |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for moment, row in self.rows:
            (rb, pb, cb), (ra, pa, ca) = row[b], row[a]
            out.append(
                f"| {moment} | {rb:.0f} | {ra:.0f} | {ra / max(rb, 1e-9):.2f} | {pb:.0f} | {pa:.0f} | "
                f"{cb:.1f} | {ca:.1f} | {ca / max(cb, 1e-9):.2f} |"
            )
        return "\n".join(out) + "\n"


def start_followers(cluster: Cluster, state_dir: Path, before_tree: Path, out: Callable[[str], None]) -> Followers:
    """Start the before and after followers (after the leader holds the Lease)."""
    who = identity.controller_identity(cluster, components.identities_dir(state_dir), seconds=6 * 3600)
    taken: set[int] = set()
    children: list[tuple[subprocess.Popen[bytes], procs.ProcessRecord]] = []
    pids: dict[str, int] = {}
    for name, tree, replica in (
        (FOLLOWERS[0], before_tree, "gpuplane-controller-before"),
        (FOLLOWERS[1], REPO_ROOT, "gpuplane-controller-after"),
    ):  # the pidfile name is what the memory tables show
        argv: Sequence[str] = components.controller_argv(who.kubeconfig, replica, free_port(taken), free_port(taken))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        known = _flags_of(tree, env)
        flags = argv[_skip(argv) :]
        dropped = [f for f in flags if f.split("=", 1)[0] not in known]
        if dropped:  # an older controller exits on a flag it does not know (e2e timings added later)
            out(f"  follower {name}: its controller has no {', '.join(dropped)}; started without them")
        argv = [sys.executable, "-m", "gpuplane.controller.main", *(f for f in flags if f not in dropped)]
        proc, record = procs.spawn(
            name,
            argv,
            log=state_dir / "logs" / f"{replica}.log",
            pid_dir=state_dir / "pids",
            env=env,
            cwd=tree,
            die_with_parent=True,
        )
        children.append((proc, record))
        pids[name] = record.pid
        out(f"  follower {name}: pid {record.pid}, code from {tree}")
    followers = Followers(pids, children)
    followers.cpu0 = {name: fleet_probe.cpu_s(pid) for name, pid in pids.items()}
    return followers


def _flags_of(tree: Path, env: Mapping[str, str]) -> set[str]:
    """The ``--flags`` the controller in ``tree`` accepts (read from its ``--help``)."""
    got = subprocess.run(
        [sys.executable, "-m", "gpuplane.controller.main", "--help"],
        env=dict(env),
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(re.findall(r"--[a-z0-9][a-z0-9-]*", got.stdout))


def _skip(argv: Sequence[str]) -> int:
    """Index of the first flag in a controller command line (after the program and any ``-m module``)."""
    return next(i for i, a in enumerate(argv) if a.startswith("--"))
