"""Which claim a GPU process belongs to: the claim whose MPS control daemon is the process or an ancestor.

The MPS server is the control daemon's child and the clients' work runs in it, so walking a
process's parents up to a known daemon pid names its claim; processes that cannot be attributed
count for nobody. :func:`parent_pid` reads ``/proc``; the rest is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from gpuplane.driver.host import PROC, proc_stat


def parent_pid(pid: int, proc: Path = PROC) -> int | None:
    """The parent of ``pid`` from /proc/<pid>/stat (None when gone)."""
    stat = proc_stat(pid, proc)
    return None if stat is None else stat.ppid


def attribute(
    pids: Iterable[int], daemon_pids: Mapping[int, str], parent_of: Callable[[int], int | None], max_depth: int = 8
) -> dict[int, str]:
    """pid -> claim uid for processes that are a claim's MPS daemon or descend from it."""
    out: dict[int, str] = {}
    for pid in pids:
        cur: int | None = pid
        for _ in range(max_depth):
            if cur is None or cur <= 1:
                break
            if cur in daemon_pids:
                out[pid] = daemon_pids[cur]
                break
            cur = parent_of(cur)
    return out


def claim_shares(per_process: Mapping[int, float], owner: Mapping[int, str]) -> dict[str, float]:
    shares: dict[str, float] = {}
    for pid, value in per_process.items():
        uid = owner.get(pid)
        if uid is not None:
            shares[uid] = shares.get(uid, 0.0) + value
    return shares
