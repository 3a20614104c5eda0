"""The offline Python base image: a Debian rootfs with Debian's python3, packed as an image.

The Dockerfiles build ``FROM ${BASE_IMAGE}`` (the public python slim image by
default). No registry is reachable here, so the e2e build passes this image
instead: ``mmdebstrap`` (Debian's package) makes a rootfs of Debian's
``essential`` set plus ``python3``, ``python3-pip``, ``libstdc++6`` (grpcio's
wheel links it) and ``ca-certificates``, with merged ``/usr`` (no ``usrmerge``,
which would pull in perl) and without manuals, docs or locales; then buildah
packs it (``FROM scratch`` + ``ADD rootfs.tar /``). Two changes make it behave
like the python image a Dockerfile expects:

* ``EXTERNALLY-MANAGED`` is removed: in a container image pip is the package
  manager (PEP 668 allows it), as in the official image;
* the host's local CAs (``/usr/local/share/ca-certificates``) are added, so pip
  inside a build trusts what this machine trusts (here the egress goes through
  a TLS-inspecting proxy; a user behind a corporate proxy does the same).

The rootfs tar is cached in ``<cache>/images/python-base-<key>/rootfs.tar``
(the slow part: Debian downloads) and the image in buildah's storage as
``localhost/gpuplane-python-base:<key>``; the key hashes the recipe below and the
CA files, so each is rebuilt only when missing or changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from e2e.images import buildah as buildah_mod
from e2e.images import steps

Printer = Callable[[str], None]

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
VARIANT = "essential"
PACKAGES = ("python3", "python3-pip", "libstdc++6", "ca-certificates")
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/lintian/*",
)
MERGED_USR_HOOKS = Path("/usr/share/mmdebstrap/hooks/merged-usr")
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
IMAGE_REPO = "localhost/gpuplane-python-base"
CONTAINERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]
"""
# Bump when the recipe changes in a way the constants above do not show.
RECIPE_REVISION = 1


@dataclasses.dataclass(frozen=True)
class BaseImage:
    """The base image in buildah's storage."""

    ref: str
    image_id: str
    rootfs: Path
    seconds: float  # time spent making it now (0 when everything was cached)


def local_cas(ca_dir: Path = LOCAL_CA_DIR) -> list[Path]:
    """The host's local CA certificates (``*.crt``), sorted."""
    return sorted(ca_dir.glob("*.crt")) if ca_dir.is_dir() else []


def recipe_key(cas: list[Path]) -> str:
    """16 hex digits naming this recipe (with these CA files)."""
    digest = hashlib.sha256()
    for part in (str(RECIPE_REVISION), SUITE, MIRROR, VARIANT, *PACKAGES, *DPKG_EXCLUDES, CONTAINERFILE):
        digest.update(part.encode() + b"\0")
    for ca in cas:
        digest.update(ca.name.encode() + b"\0" + ca.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def mmdebstrap_command(dest: Path, cas: list[Path], mmdebstrap: str = "mmdebstrap") -> list[str]:
    """The mmdebstrap command line that writes the rootfs tar ``dest``."""
    cmd = [
        mmdebstrap,
        f"--variant={VARIANT}",
        f"--include={','.join(PACKAGES)}",
        f"--hook-dir={MERGED_USR_HOOKS}",
    ]
    cmd += [f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES]
    cmd.append('--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED')
    for ca in cas:
        cmd.append(f"--customize-hook=copy-in {ca} /usr/local/share/ca-certificates/")
    if cas:
        cmd.append('--customize-hook=chroot "$1" update-ca-certificates')
    cmd.append('--customize-hook=rm -rf "$1"/var/cache/debconf/*-old "$1"/var/log/apt "$1"/var/log/dpkg.log')
    cmd += [SUITE, str(dest), MIRROR]
    return cmd


def _make_rootfs(dest: Path, cas: list[Path], environ: Mapping[str, str], out: Printer) -> float:
    mmdebstrap = shutil.which("mmdebstrap", path=environ.get("PATH"))
    if mmdebstrap is None:
        raise buildah_mod.BuilderMissing(
            "mmdebstrap was not found on PATH; the offline Python base image is a Debian rootfs it makes: "
            f"run `sudo {buildah_mod.APT_INSTALL}`."
        )
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}.tar")
    out(f"base image: making a Debian {SUITE} rootfs with {', '.join(PACKAGES)} (mmdebstrap; about 2 minutes)")
    try:
        seconds = steps.run(
            mmdebstrap_command(tmp, cas, mmdebstrap),
            label="mmdebstrap",
            log=dest.parent / "mmdebstrap.log",
            out=out,
            env=environ,
            hint=f"mmdebstrap needs root and Debian's archive at {MIRROR} (apt's proxy settings apply)",
        )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    out(f"base image: rootfs {dest.stat().st_size / 1e6:.0f} MB in {steps.fmt_seconds(seconds)}")
    return seconds


def ensure_base(
    builder: buildah_mod.Buildah,
    cache: Path,
    *,
    environ: Mapping[str, str] | None = None,
    out: Printer = print,
) -> BaseImage:
    """The base image, made (rootfs and/or image) only where the cache lacks it."""
    env = dict(os.environ if environ is None else environ)
    cas = local_cas()
    key = recipe_key(cas)
    ref = f"{IMAGE_REPO}:{key}"
    rootfs = cache / "images" / f"python-base-{key}" / "rootfs.tar"
    image_id = builder.image_id(ref)
    if image_id is not None:
        out(f"base image: {ref} cached ({image_id[:12]})")
        return BaseImage(ref, image_id, rootfs, 0.0)
    started = time.monotonic()
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    if rootfs.is_file():
        out(f"base image: rootfs cached ({rootfs})")
    else:
        _make_rootfs(rootfs, cas, env, out)
    containerfile = rootfs.parent / "Containerfile"
    containerfile.write_text(CONTAINERFILE)
    builder.bud(
        containerfile,
        rootfs.parent,
        ref,
        build_args={},
        label="base image",
        log=rootfs.parent / "build.log",
        out=out,
        extra=("--timestamp", "0"),
    )
    image_id = builder.image_id(ref)
    if image_id is None:
        raise steps.StepError(f"buildah reported success but {ref} is not in {builder.root}")
    seconds = time.monotonic() - started
    out(f"base image: {ref} ({image_id[:12]}) in {steps.fmt_seconds(seconds)}")
    return BaseImage(ref, image_id, rootfs, seconds)
