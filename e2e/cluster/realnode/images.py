"""The two images every real node has, built offline: pause and busybox.

No image can be pulled here (no registry is reachable), so the images the
examples and tests name are made from local binaries and imported into each
real node's containerd:

* ``registry.k8s.io/pause:3.10``: the static pause program of
  ``e2e/cluster/nodebuild/pause`` as ``/pause`` (the tag the examples use; containerd's
  sandbox image);
* ``docker.io/library/busybox:1.36``: Debian's ``busybox-static`` (``/bin/busybox``
  with a symlink per applet, ``sh`` by default), for tests that need a shell.

Each archive (an OCI layout tar, ``e2e.cluster.realnode.oci``) is cached in
``<cache>/images/`` under a name carrying the hash of what went in, and rebuilt only
when that changes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from e2e.cluster.realnode import oci

Printer = Callable[[str], None]

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BUSYBOX_IMAGE = "docker.io/library/busybox:1.36"
BUSYBOX_BINARY = Path("/bin/busybox")
# Bump when the image layout changes, so cached archives are rebuilt.
IMAGE_RECIPE = "r1"
_PT_INTERP = 3


class ImageError(RuntimeError):
    """An image cannot be built (a binary is missing or not static)."""


@dataclasses.dataclass(frozen=True)
class ImageArchive:
    """An image's name and its OCI layout archive."""

    name: str
    archive: Path


def is_static_elf(path: Path) -> bool:
    """Whether ``path`` is a 64-bit ELF executable without a program interpreter (statically linked)."""
    with path.open("rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:
            return False
        endian = "<" if header[5] == 1 else ">"
        (phoff,) = struct.unpack_from(endian + "Q", header, 32)
        phentsize, phnum = struct.unpack_from(endian + "HH", header, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    types = (struct.unpack_from(endian + "I", table, i * phentsize)[0] for i in range(phnum))
    return _PT_INTERP not in types


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def _cached(cache_dir: Path, stem: str, key: str) -> Path:
    return cache_dir / "images" / f"{stem}-{key}.tar"


def pause_image(pause_binary: Path, cache_dir: Path) -> ImageArchive:
    """``registry.k8s.io/pause:3.10`` from the static pause program."""
    data = pause_binary.read_bytes()
    archive = _cached(cache_dir, "pause-3.10", _digest(data, IMAGE_RECIPE.encode()))
    if not archive.is_file():
        oci.write_image(
            archive,
            PAUSE_IMAGE,
            [oci.FileEntry("pause", data=data, mode=0o755)],
            oci.ImageConfig(entrypoint=("/pause",), env=()),
        )
    return ImageArchive(PAUSE_IMAGE, archive)


def busybox_applets(binary: Path) -> list[str]:
    """The applet paths ``busybox --list-full`` names (``bin/sh``, ``usr/bin/env``, ...)."""
    listed = subprocess.run([str(binary), "--list-full"], capture_output=True, text=True, check=True, timeout=30)
    return sorted({line.strip().lstrip("/") for line in listed.stdout.splitlines() if line.strip()})


def busybox_image(cache_dir: Path, binary: Path = BUSYBOX_BINARY) -> ImageArchive:
    """``docker.io/library/busybox:1.36`` from Debian's busybox-static."""
    if not binary.is_file():
        raise ImageError(
            f"{binary} is missing: the busybox image is made from Debian's busybox-static "
            "(run scripts/setup-realnodes.sh, or apt-get install busybox-static)"
        )
    if not is_static_elf(binary):
        raise ImageError(
            f"{binary} is not statically linked (Debian's 'busybox' package?); the image needs busybox-static "
            "(apt-get install busybox-static)"
        )
    data = binary.read_bytes()
    archive = _cached(cache_dir, "busybox-1.36", _digest(data, IMAGE_RECIPE.encode()))
    if archive.is_file():
        return ImageArchive(BUSYBOX_IMAGE, archive)
    entries = [oci.FileEntry("bin/busybox", data=data, mode=0o755)]
    entries += [oci.FileEntry(a, link="/bin/busybox") for a in busybox_applets(binary) if a != "bin/busybox"]
    entries += [
        oci.FileEntry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
        oci.FileEntry("etc/group", data=b"root:x:0:\nnogroup:x:65534:\n"),
        oci.FileEntry("root", mode=0o700),
        oci.FileEntry("tmp", mode=0o1777),
    ]
    oci.write_image(archive, BUSYBOX_IMAGE, entries, oci.ImageConfig(cmd=("sh",)))
    return ImageArchive(BUSYBOX_IMAGE, archive)


def node_images(pause_binary: Path, cache_dir: Path, out: Printer = print) -> list[ImageArchive]:
    """Both images (built into the cache if missing)."""
    images = [pause_image(pause_binary, cache_dir), busybox_image(cache_dir)]
    out("images: " + ", ".join(f"{i.name} ({i.archive.stat().st_size // 1024} KiB)" for i in images))
    return images
