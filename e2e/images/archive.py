"""OCI image archives for containerd: their names and their sizes.

``buildah push IMAGE oci-archive:FILE:NAME`` writes an OCI layout tar whose
``index.json`` names the image by ``org.opencontainers.image.ref.name``.
containerd's importer (``ctr images import``) reads ``io.containerd.image.name``
first, so :func:`name_images` rewrites ``index.json`` with one entry per name,
each carrying both annotations (one image, several names: a moving ``:dev`` tag
and a tag of its cache key). :func:`sizes` reads the compressed and
uncompressed size of the image's layers from the archive itself.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import io
import json
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IMAGE_NAME = "io.containerd.image.name"
REF_NAME = "org.opencontainers.image.ref.name"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Bytes of an image's layers, as stored (gzip) and as unpacked (tar)."""

    compressed: int
    uncompressed: int


def read_index(archive: Path) -> dict[str, Any]:
    """The archive's ``index.json``."""
    with tarfile.open(archive) as tar:
        data: dict[str, Any] = json.loads(_index_bytes(tar))
        return data


def names(archive: Path) -> list[str]:
    """The image names containerd will give the archive's images."""
    return [
        str((m.get("annotations") or {}).get(IMAGE_NAME) or (m.get("annotations") or {}).get(REF_NAME, ""))
        for m in read_index(archive).get("manifests", [])
    ]


def name_images(src: Path, dest: Path, image_names: Sequence[str]) -> None:
    """Copy the OCI archive ``src`` to ``dest`` with its one manifest listed once under each name."""
    if not image_names:
        raise ValueError("an image needs at least one name")
    index = read_index(src)
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise ValueError(f"{src} holds {len(manifests)} manifests; expected one image")
    entries = []
    for name in image_names:
        entry = copy.deepcopy(manifests[0])
        entry["annotations"] = {**(entry.get("annotations") or {}), IMAGE_NAME: name, REF_NAME: name}
        entries.append(entry)
    data = json.dumps({**index, "manifests": entries}, separators=(",", ":")).encode()
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with tarfile.open(src) as tar_in, tarfile.open(tmp, "w") as tar_out:
            for member in tar_in:
                if member.name == "index.json":
                    info = copy.copy(member)
                    info.size = len(data)
                    tar_out.addfile(info, io.BytesIO(data))
                elif member.isfile():
                    tar_out.addfile(member, tar_in.extractfile(member))
                else:
                    tar_out.addfile(member)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def sizes(archive: Path) -> Sizes:
    """Compressed and uncompressed size of the layers of the archive's (first) image."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/{digest.replace(':', '/')}")
            if member is None:
                raise ValueError(f"{archive}: blob {digest} missing")
            return member.read()

        index = json.loads(_index_bytes(tar))
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        compressed = uncompressed = 0
        for layer in manifest["layers"]:
            compressed += int(layer["size"])
            member = tar.extractfile(f"blobs/{layer['digest'].replace(':', '/')}")
            assert member is not None
            stream = gzip.GzipFile(fileobj=member) if "gzip" in layer["mediaType"] else member
            while chunk := stream.read(1 << 20):
                uncompressed += len(chunk)
        return Sizes(compressed, uncompressed)


def _index_bytes(tar: tarfile.TarFile) -> bytes:
    member = tar.extractfile("index.json")
    if member is None:
        raise ValueError("no index.json in the archive: not an OCI archive")
    return member.read()
