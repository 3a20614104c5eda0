"""/dev/nvidia-caps minors of MIG instances: the numbering the NVIDIA driver gives them; device majors.

A container using a MIG device needs the device nodes ``/dev/nvidia-caps/nvidia-cap<N>`` of its
GPU instance's and compute instance's ``access`` files. The NVIDIA driver lists those minors in
``/proc/driver/nvidia-caps/mig-minors``; the real backend parses that file
(:func:`parse_mig_minors`), the simulator computes the same numbering (:func:`caps_minors`).
The dynamic majors (``nvidia-caps``, ``nvidia-caps-imex-channels``) are read from ``/proc/devices``
(:func:`parse_proc_devices`, :func:`imex_channel_major`). Pure.
"""

from __future__ import annotations


def caps_minors(gpu_minor: int, gi_id: int, ci_id: int | None) -> tuple[int, int | None]:
    """/dev/nvidia-caps minors of a GI's and CI's access files, per the driver's mig-minors numbering.

    The driver numbers ``config``=1, ``monitor``=2, then for each GPU 15 GIs x (1 GI + 8 CI) entries.
    (Layout of /proc/driver/nvidia-caps/mig-minors; read that file on real hardware.)
    """
    gi_minor = 3 + gpu_minor * 15 * 9 + gi_id * 9
    return gi_minor, (None if ci_id is None else gi_minor + 1 + ci_id)


def parse_mig_minors(text: str) -> dict[tuple[int, int, int | None], int]:
    """Parse /proc/driver/nvidia-caps/mig-minors into {(gpu, gi, ci or None): minor}."""
    out: dict[tuple[int, int, int | None], int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 2 or not fields[0].startswith("gpu"):
            continue
        parts = fields[0].split("/")
        try:
            gpu = int(parts[0][3:])
            if len(parts) == 3 and parts[1].startswith("gi") and parts[2] == "access":
                out[(gpu, int(parts[1][2:]), None)] = int(fields[1])
            elif len(parts) == 4 and parts[2].startswith("ci") and parts[3] == "access":
                out[(gpu, int(parts[1][2:]), int(parts[2][2:]))] = int(fields[1])
        except ValueError:
            continue
    return out


IMEX_CHANNELS = "nvidia-caps-imex-channels"


def parse_proc_devices(text: str) -> dict[str, int]:
    """The ``Character devices:`` section of /proc/devices as {name: major} (block devices ignored)."""
    out: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("devices:"):
            section = stripped
            continue
        fields = stripped.split(maxsplit=1)
        if section == "Character devices:" and len(fields) == 2 and fields[0].isdigit():
            out.setdefault(fields[1], int(fields[0]))
    return out


def imex_channel_major(text: str) -> int | None:
    """The IMEX channels' major from /proc/devices (None: a driver without IMEX channels, before R550)."""
    return parse_proc_devices(text).get(IMEX_CHANNELS)
