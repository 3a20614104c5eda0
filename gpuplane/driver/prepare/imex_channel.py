"""A claim's IMEX channel: its device node made if missing, and what the container gets (issue 35).

A gang across the trays of one NVLink clique shares memory through an IMEX channel: every rank
opens ``/dev/nvidia-caps-imex-channels/channel<N>``, the same N on every node of the gang
(``gpuplane.controller.imex.decide`` chooses it). The NVIDIA driver registers the channels' major in
``/proc/devices`` (dynamic, per node) but makes no node until someone does, and a reboot removes
them; so the driver makes the node a claim needs, from that major, and checks one already there.

The container gets the channel's node (``/dev/...`` in the container, ``host_dev/...`` on the host,
as for the GPUs) and ``GPUPLANE_IMEX_CHANNEL`` / ``GPUPLANE_IMEX_DOMAIN`` naming what it got. It gets
no other channel: a pod of one gang cannot open another gang's.

Called by prepare through :mod:`.imex_claims`, when the controller's ``ImexDomain`` names the claim here.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gpuplane.api import names
from gpuplane.driver.hw import caps
from gpuplane.driver.prepare import cdi

CHANNEL_DIR = caps.IMEX_CHANNELS
CHANNEL_COUNT = names.IMEX_CHANNEL_COUNT
"""The channel minors 0..CHANNEL_COUNT-1 exist."""
ENV_CHANNEL = "GPUPLANE_IMEX_CHANNEL"
ENV_DOMAIN = "GPUPLANE_IMEX_DOMAIN"


class ChannelError(Exception):
    """The channel's node cannot be made or is wrong; the message says what to do."""


@dataclass(frozen=True)
class Channel:
    """The channel a claim gets, and the IMEX domain it belongs to."""

    index: int
    domain: str


def node_path(dev_root: Path, index: int) -> Path:
    """``<dev_root>/nvidia-caps-imex-channels/channel<index>``."""
    return dev_root / CHANNEL_DIR / f"channel{index}"


def ensure_node(dev_root: Path, proc_devices: Path, index: int, *, placeholder_ok: bool = False) -> Path:
    """Make channel ``index``'s node under ``dev_root`` if missing, with the major ``proc_devices`` lists.

    ``placeholder_ok``: where the process may not make device nodes (no CAP_MKNOD), an empty file is
    enough (the simulator's placeholders, for the kubelet stand-in); otherwise that is an error.
    """
    if not 0 < index < CHANNEL_COUNT:
        raise ChannelError(f"IMEX channel {index} is out of range (1..{CHANNEL_COUNT - 1}; 0 is never handed out)")
    try:
        text = proc_devices.read_text()
    except OSError as err:
        raise ChannelError(f"cannot read {proc_devices}: {err.strerror}") from None
    major = caps.imex_channel_major(text)
    if major is None:
        raise ChannelError(
            f"{proc_devices} has no {CHANNEL_DIR} line: the NVIDIA driver on this node has no IMEX channels "
            "(it needs R550 or later, loaded with NVreg_ImexChannelCount > 0); this node cannot run a gang "
            "across trays"
        )
    path = node_path(dev_root, index)
    try:
        info = path.lstat()
    except FileNotFoundError:
        info = None
    if info is not None:
        if stat.S_ISCHR(info.st_mode):
            found = (os.major(info.st_rdev), os.minor(info.st_rdev))
            if found != (major, index):
                raise ChannelError(
                    f"{path} is the device {found[0]}:{found[1]}, not {major}:{index} as {proc_devices} says; "
                    "remove it (the driver makes it again)"
                )
            return path
        if placeholder_ok and stat.S_ISREG(info.st_mode):
            return path
        raise ChannelError(f"{path} exists and is not a character device; remove it (the driver makes it again)")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, index))
        os.chmod(path, 0o666)  # mknod's mode is masked by the umask
    except PermissionError:
        if not placeholder_ok:
            raise ChannelError(
                f"cannot make {path} (no CAP_MKNOD): run the driver privileged, as its DaemonSet does"
            ) from None
        path.touch(mode=0o666)
    return path


def edits(channel: Channel, host_dev: Path) -> tuple[tuple[cdi.DeviceNode, ...], tuple[str, ...]]:
    """The device node and environment a claim with ``channel`` adds to its containers."""
    rel = f"{CHANNEL_DIR}/channel{channel.index}"
    node = cdi.DeviceNode(path=f"/dev/{rel}", host_path=str(host_dev / rel))
    env = (f"{ENV_CHANNEL}={channel.index}", f"{ENV_DOMAIN}={channel.domain}")
    return (node,), env
