"""Build gpuplane's images from ``Dockerfile.driver`` and ``Dockerfile.controller``, cached by what went in.

``ensure_images()`` is what ``python -m e2e images`` runs: the offline base
(:mod:`e2e.images.base`), then for each image ``buildah bud -f Dockerfile.X
--build-arg BASE_IMAGE=<base> --build-arg VERSION=<package version> .`` in the
repository root (the command a user runs with ``docker build``, with the base
swapped through its build argument), exported as an OCI archive
``<cache>/images/<name>-<key>.oci.tar`` for ``ctr images import``. ``key`` is
:func:`e2e.images.context.cache_key` (Dockerfile, copied files, build args, base
image id): an archive already in the cache is a hit and nothing is built. Each
archive names its image twice, ``localhost/<name>:dev`` (what
``manifests/overlays/local`` runs) and ``localhost/<name>:<version>-<key>``
(a name of this exact build, for upgrade tests). An exclusive lock on the cache
directory keeps two processes from building at once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from e2e.cluster import build as k8sbuild
from e2e.images import archive as oci_archive
from e2e.images import base, buildah, context, steps

Printer = Callable[[str], None]

REPO = Path(__file__).resolve().parent.parent.parent
REGISTRY = "localhost"
DEV_TAG = "dev"
KEEP_ARCHIVES = 4  # per image: the newest archives stay in the cache (older builds for upgrade tests)


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """One image the project ships: its name and Dockerfile (relative to the repository)."""

    name: str
    dockerfile: str


IMAGES: tuple[ImageSpec, ...] = (
    ImageSpec("gpuplane-driver", "Dockerfile.driver"),
    ImageSpec("gpuplane-controller", "Dockerfile.controller"),
)


@dataclasses.dataclass(frozen=True)
class BuiltImage:
    """An image as an OCI archive in the cache."""

    name: str
    key: str
    archive: Path
    names: tuple[str, ...]  # the names containerd gives it on import; names[0] is the :dev tag
    cached: bool  # True: found in the cache, nothing built
    seconds: float  # build + export time now (0 on a hit)
    sizes: oci_archive.Sizes

    @property
    def ref(self) -> str:
        """The moving ``:dev`` name the local overlay uses."""
        return self.names[0]

    @property
    def pinned_ref(self) -> str:
        """The name of this exact build."""
        return self.names[1]


def package_version(pyproject: Path) -> str:
    """``version = "..."`` of the ``[project]`` table."""
    match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{pyproject} has no project version")
    return match.group(1)


def image_names(spec: ImageSpec, version: str, key: str) -> tuple[str, str]:
    """``(localhost/<name>:dev, localhost/<name>:<version>-<key[:12]>)``."""
    return f"{REGISTRY}/{spec.name}:{DEV_TAG}", f"{REGISTRY}/{spec.name}:{version}-{key[:12]}"


def build_image(
    builder: buildah.Buildah,
    spec: ImageSpec,
    base_image: base.BaseImage,
    *,
    repo: Path,
    cache: Path,
    out: Printer,
) -> BuiltImage:
    """One image: a cache hit, or ``buildah bud`` and an export to its archive."""
    version = package_version(repo / "pyproject.toml")
    build_args = {"BASE_IMAGE": base_image.ref, "VERSION": version}
    dockerfile = repo / spec.dockerfile
    key = context.cache_key(dockerfile, repo, build_args=build_args, base_image_id=base_image.image_id)[:16]
    names = image_names(spec, version, key)
    dest = cache / "images" / f"{spec.name}-{key}.oci.tar"
    if cache_hit(dest):
        out(f"{spec.name}: cache hit ({dest.name}), nothing to build")
        return BuiltImage(spec.name, key, dest, names, True, 0.0, oci_archive.sizes(dest))
    out(f"{spec.name}: building {spec.dockerfile} on {base_image.ref} (key {key})")
    started = time.monotonic()
    logs = cache / "images" / "logs"
    builder.bud(
        dockerfile,
        repo,
        names[1],
        build_args=build_args,
        label=spec.name,
        log=logs / f"{spec.name}-{key}.build.log",
        out=out,
    )
    raw = dest.with_name(f".{dest.name}.raw-{os.getpid()}")
    try:
        builder.push_oci_archive(names[1], raw, names[1], log=logs / f"{spec.name}-{key}.push.log", out=out)
        oci_archive.name_images(raw, dest, names)
    finally:
        raw.unlink(missing_ok=True)
        builder.remove_image(names[1])  # the archive is the artifact; buildah's copy would only pile up
    prune_archives(cache / "images", spec.name, keep=KEEP_ARCHIVES, out=out)
    seconds = time.monotonic() - started
    built = BuiltImage(spec.name, key, dest, names, False, seconds, oci_archive.sizes(dest))
    out(
        f"{spec.name}: built in {steps.fmt_seconds(seconds)}: {built.sizes.uncompressed / 1e6:.0f} MB unpacked, "
        f"{built.sizes.compressed / 1e6:.0f} MB compressed ({dest})"
    )
    return built


def cache_hit(archive: Path) -> bool:
    """Whether ``archive`` is cached; a hit marks it used now, so that pruning keeps it.

    Pruning keeps the newest archives by mtime: without the mark, a run that uses an old
    build (N-1 of the upgrade tests) and then builds N lost N-1's archive before importing it.
    """
    if not archive.is_file():
        return False
    os.utime(archive)
    return True


def prune_archives(directory: Path, name: str, *, keep: int, out: Printer) -> list[Path]:
    """Delete all but the ``keep`` most recently built or used ``<name>-<key>.oci.tar`` archives; return them."""
    archives = sorted(directory.glob(f"{name}-*.oci.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = archives[keep:]
    for path in removed:
        path.unlink(missing_ok=True)
        out(f"{name}: removed an old archive ({path.name})")
    return removed


def ensure_images(
    *,
    repo: Path = REPO,
    cache: Path | None = None,
    specs: Sequence[ImageSpec] = IMAGES,
    environ: Mapping[str, str] | None = None,
    out: Printer = print,
) -> list[BuiltImage]:
    """Every image of ``specs`` as an OCI archive in the cache, built where missing."""
    env = dict(os.environ if environ is None else environ)
    root = cache or k8sbuild.cache_root(env)
    builder = buildah.Buildah.find(root, env)
    (root / "images").mkdir(parents=True, exist_ok=True)
    with (root / "images" / ".gpuplane-images.lock").open("w") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out(f"another process is building images in {root / 'images'}; waiting for it ...")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        base_image = base.ensure_base(builder, root, environ=env, out=out)
        return [build_image(builder, spec, base_image, repo=repo, cache=root, out=out) for spec in specs]
