"""A real node's own cgroup subtree (kubelet's ``cgroupRoot``): made before kubelet starts, removed after.

kubelet with ``cgroupDriver: cgroupfs`` refuses to start unless its
``cgroupRoot`` already exists in every cgroup v1 hierarchy ("cgroup [...] has
some missing paths"); a new v1 ``cpuset`` cgroup also starts with empty
``cpuset.cpus``/``cpuset.mems``, in which nothing can run, so they are copied
from the parent. On a hybrid host runc also joins the unified (cgroup2)
hierarchy, so the root is made there too. On pure cgroup v2 the controllers are
enabled for the subtree.

``kill_all`` SIGKILLs every process left in the subtree (containers whose shim
is gone); ``remove`` then deletes the subtree depth first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from e2e.cluster.realnode.host import CgroupLayout, cgroup_layout


def _hierarchies(layout: CgroupLayout) -> list[Path]:
    points = sorted(set(layout.v1.values()))
    if layout.unified is not None:
        points.append(layout.unified)
    return points


def paths(name: str, layout: CgroupLayout | None = None) -> list[Path]:
    """The directory of cgroup ``name`` (e.g. ``/gpuplane-ab12cd-r0``) in every hierarchy."""
    found = layout or cgroup_layout()
    return [point / name.strip("/") for point in _hierarchies(found)]


def create(name: str, layout: CgroupLayout | None = None) -> list[Path]:
    """Make cgroup ``name`` in every hierarchy (cpuset values copied from the parent); return the paths."""
    found = layout or cgroup_layout()
    made = []
    for point in _hierarchies(found):
        path = point / name.strip("/")
        path.mkdir(exist_ok=True)
        made.append(path)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent_value, own = path.parent / knob, path / knob
            if parent_value.is_file() and own.is_file() and not own.read_text().strip():
                own.write_text(parent_value.read_text().strip())
        if point == found.unified and found.is_v2:
            available = (path / "cgroup.controllers").read_text().split()
            with contextlib.suppress(OSError):
                (path / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in available))
    return made


def _walk(top: Path) -> Iterator[Path]:
    """``top`` and every cgroup below it, deepest first."""
    for directory, _subdirs, _files in os.walk(top, topdown=False):
        yield Path(directory)


def pids(name: str, layout: CgroupLayout | None = None) -> set[int]:
    """Every process in the subtree of cgroup ``name``, in any hierarchy."""
    found: set[int] = set()
    for top in paths(name, layout):
        if not top.is_dir():
            continue
        for cgroup in _walk(top):
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
    return found


def kill_all(name: str, layout: CgroupLayout | None = None, timeout: float = 10.0) -> int:
    """SIGKILL every process in the subtree until none is left; return how many were signalled."""
    signalled: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        left = pids(name, layout)
        if not left or time.monotonic() > deadline:
            return len(signalled)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                signalled.add(pid)
        time.sleep(0.1)


def remove(name: str, layout: CgroupLayout | None = None, timeout: float = 10.0) -> list[Path]:
    """Delete the subtree of cgroup ``name`` everywhere (killing what still runs in it); return what is left."""
    kill_all(name, layout)
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for top in paths(name, layout):
            if not top.is_dir():
                continue
            for cgroup in _walk(top):
                try:
                    cgroup.rmdir()
                except FileNotFoundError:
                    continue
                except OSError:
                    left.append(cgroup)
        if not left or time.monotonic() > deadline:
            return left
        kill_all(name, layout, timeout=1.0)
        time.sleep(0.2)
