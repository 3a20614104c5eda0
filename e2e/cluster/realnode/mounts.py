"""Unmount everything a real node mounted under its directories.

kubelet mounts pod volumes (service-account tokens on tmpfs) under its root
dir, containerd mounts container root filesystems (overlay) and ``/dev/shm``
under its state dir, and the CRI binds each pod's network namespace to a file
there. ``unmount_under(top)`` reads ``/proc/self/mountinfo`` and unmounts every
mount at or below ``top``, deepest first, detaching lazily what is still busy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from pathlib import Path

MNT_DETACH = 2
_ESCAPE = re.compile(r"\\([0-7]{3})")


def _decode(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(top: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Path]:
    """Mount points at or below ``top``, deepest first."""
    prefix = str(top.resolve()).rstrip("/")
    found = []
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _decode(fields[4])
        if point == prefix or point.startswith(prefix + "/"):
            found.append(Path(point))
    # Deepest first; a path mounted twice appears twice and is unmounted twice.
    return sorted(found, key=lambda p: (len(p.parts), str(p)), reverse=True)


def _umount2(target: Path, flags: int) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.umount2(os.fsencode(target), flags) == 0:
        return 0
    return ctypes.get_errno()


def unmount_under(top: Path) -> list[str]:
    """Unmount every mount at or below ``top``; return what could not be unmounted, with why."""
    failed: list[str] = []
    for _ in range(3):
        points = mounts_under(top)
        if not points:
            return []
        failed = []
        for point in points:
            errno = _umount2(point, 0)
            if errno not in (0, 22):  # EINVAL: no longer a mount point (a parent went first)
                errno = _umount2(point, MNT_DETACH)
                if errno not in (0, 22):
                    failed.append(f"{point}: {os.strerror(errno)}")
    return failed
