"""Write a container image as an OCI image layout archive, with no registry and no image builder.

An OCI layout (image-spec v1.1 ``image-layout.md``) is a directory, here packed as
a tar: ``oci-layout`` (``{"imageLayoutVersion": "1.0.0"}``), ``index.json`` naming
the image's manifest, and every blob (layer, config, manifest) under
``blobs/sha256/<digest>``. ``ctr images import`` reads it and names the image from
the index entry's ``io.containerd.image.name`` annotation.

``FileEntry`` lists what one layer holds (regular files, directories, symlinks);
``write_image`` makes a single-layer image of it. The archive is byte-for-byte
reproducible: entries sorted, owner root, mtimes zero, gzip without a timestamp,
so the same inputs give the same digests (and a cache keyed by them stays valid).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import platform
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
IMAGE_NAME_ANNOTATION = "io.containerd.image.name"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"
_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One entry of a layer: a file (``data``), a directory, or a symlink (``link``)."""

    path: str  # inside the image, without the leading "/"
    data: bytes | None = None
    mode: int = 0o644
    link: str | None = None

    @property
    def is_dir(self) -> bool:
        """A directory: neither data nor a link target."""
        return self.data is None and self.link is None


@dataclasses.dataclass(frozen=True)
class ImageConfig:
    """The runtime part of the image config."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    working_dir: str = "/"


def go_arch(machine: str | None = None) -> str:
    """This machine's architecture as OCI (Go) names it: ``x86_64`` -> ``amd64``."""
    name = machine or platform.machine()
    try:
        return _GO_ARCH[name]
    except KeyError as err:
        raise ValueError(f"unsupported machine architecture {name!r} (known: {', '.join(sorted(_GO_ARCH))})") from err


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _tar_info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def layer_tar(entries: Iterable[FileEntry]) -> bytes:
    """An uncompressed layer tar of ``entries`` (parents first, sorted, reproducible)."""
    by_path: dict[str, FileEntry] = {}
    for entry in entries:
        path = entry.path.strip("/")
        if not path or ".." in path.split("/"):
            raise ValueError(f"bad path in layer: {entry.path!r}")
        by_path[path] = dataclasses.replace(entry, path=path)
    # Every parent directory gets an entry of its own (0755) unless one was given.
    for path in list(by_path):
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            by_path.setdefault(parent, FileEntry(parent, mode=0o755))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(by_path):
            entry = by_path[path]
            if entry.is_dir:
                tar.addfile(_tar_info(path + "/", tarfile.DIRTYPE, entry.mode))
            elif entry.link is not None:
                tar.addfile(_tar_info(path, tarfile.SYMTYPE, 0o777, link=entry.link))
            else:
                assert entry.data is not None
                tar.addfile(_tar_info(path, tarfile.REGTYPE, entry.mode, len(entry.data)), io.BytesIO(entry.data))
    return buffer.getvalue()


def _gzip(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(data)
    return out.getvalue()


def write_image(
    archive: Path, name: str, entries: Iterable[FileEntry], config: ImageConfig, *, arch: str | None = None
) -> str:
    """Write a one-layer image called ``name`` (``registry/repo:tag``) as an OCI layout tar; return its digest."""
    architecture = arch or go_arch()
    raw_layer = layer_tar(entries)
    layer = _gzip(raw_layer)
    image_config: dict[str, Any] = {
        "architecture": architecture,
        "os": "linux",
        "config": {"Env": list(config.env), "WorkingDir": config.working_dir},
        "rootfs": {"type": "layers", "diff_ids": [_digest(raw_layer)]},
        "history": [{"created_by": "gpuplane e2e (e2e/cluster/realnode/images.py)"}],
    }
    if config.entrypoint:
        image_config["config"]["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        image_config["config"]["Cmd"] = list(config.cmd)
    config_blob = _canonical(image_config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": MEDIA_LAYER_GZIP, "digest": _digest(layer), "size": len(layer)}],
    }
    manifest_blob = _canonical(manifest)
    tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": _digest(manifest_blob),
                "size": len(manifest_blob),
                "platform": {"architecture": architecture, "os": "linux"},
                "annotations": {IMAGE_NAME_ANNOTATION: name, REF_NAME_ANNOTATION: tag},
            }
        ],
    }
    files = {
        "oci-layout": _canonical({"imageLayoutVersion": "1.0.0"}),
        "index.json": _canonical(index),
        **{f"blobs/sha256/{_digest(b).split(':')[1]}": b for b in (layer, config_blob, manifest_blob)},
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs/", "blobs/sha256/"):
            tar.addfile(_tar_info(directory, tarfile.DIRTYPE, 0o755))
        for path in sorted(files):
            data = files[path]
            tar.addfile(_tar_info(path, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(f".{archive.name}.tmp-{os.getpid()}")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, archive)
    return _digest(manifest_blob)


def read_index(archive: Path) -> dict[str, Any]:
    """The ``index.json`` of an OCI layout archive (to check what an archive names)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive} has no index.json: not an OCI image layout")
        data: dict[str, Any] = json.loads(member.read())
    return data
