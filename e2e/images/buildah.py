"""buildah, the image builder from Debian's packages, as the e2e suite runs it.

Rootful, with its own storage under the cache (``<cache>/buildah/storage``, the
``overlay`` driver; ``GPUPLANE_BUILDAH_DRIVER=vfs`` where overlayfs is not
available) so it never touches another user's images, and ``chroot`` isolation:
this machine has no systemd and a cgroup v1 hybrid, and the default OCI
isolation would need runc to make cgroups and namespaces for every ``RUN`` step;
chroot isolation runs them in a chroot with the host's network, which is all a
``pip wheel`` needs. ``bud`` is the same operation as ``docker build``
(``buildah build-using-dockerfile``), reading the Dockerfile and ``.dockerignore``
as Docker does.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from e2e.images import steps

Printer = Callable[[str], None]

APT_INSTALL = "apt-get install -y --no-install-recommends buildah mmdebstrap"
ISOLATION = "chroot"


class BuilderMissing(RuntimeError):
    """The image builder is not installed, or cannot run here; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Buildah:
    """One buildah binary with the storage the e2e suite uses."""

    binary: str
    root: Path
    runroot: Path
    driver: str = "overlay"

    @classmethod
    def find(cls, cache: Path, environ: Mapping[str, str]) -> Buildah:
        """The buildah on PATH with storage under ``cache``; raise BuilderMissing saying how to install it."""
        binary = shutil.which("buildah", path=environ.get("PATH"))
        if binary is None:
            raise BuilderMissing(
                "buildah was not found on PATH. The images are built from the project's Dockerfiles with "
                f"buildah from Debian's packages: run `sudo {APT_INSTALL}` (or `bash scripts/setup-images.sh`)."
            )
        if os.geteuid() != 0:
            raise BuilderMissing(
                "building images needs root (rootful buildah: chroot isolation and overlay storage); "
                "run the build as root, e.g. `sudo -E python -m e2e images`."
            )
        driver = environ.get("GPUPLANE_BUILDAH_DRIVER", "overlay")
        return cls(binary, cache / "buildah" / "storage", cache / "buildah" / "run", driver)

    def command(self, *args: str) -> list[str]:
        """``buildah --root ... --runroot ... --storage-driver ... ARGS``."""
        return [
            self.binary,
            "--root",
            str(self.root),
            "--runroot",
            str(self.runroot),
            "--storage-driver",
            self.driver,
            *args,
        ]

    def version(self) -> str:
        """``buildah version 1.28.2 (...)`` as buildah prints it."""
        return subprocess.run(self.command("--version"), capture_output=True, text=True, check=True).stdout.strip()

    def image_id(self, ref: str) -> str | None:
        """The full id of image ``ref`` in this storage, or None when there is no such image."""
        proc = subprocess.run(
            self.command("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref),
            capture_output=True,
            text=True,
            check=False,
        )
        ident = proc.stdout.strip()
        return ident if proc.returncode == 0 and ident else None

    def bud(
        self,
        dockerfile: Path,
        context: Path,
        tag: str,
        *,
        build_args: Mapping[str, str],
        label: str,
        log: Path,
        out: Printer,
        extra: Sequence[str] = (),
    ) -> float:
        """``buildah bud -f DOCKERFILE --build-arg ... -t TAG CONTEXT``; returns the seconds it took."""
        # No --layers: buildah 1.28 (Debian 12) cannot bind-mount a stage whose steps all came
        # from its layer cache (`RUN --mount=type=bind,from=build`: "couldn't find .../merged/wheels
        # on host"), and the images are cached by their whole input anyway (e2e.images.context).
        args = ["bud", "--isolation", ISOLATION, "-f", str(dockerfile), "-t", tag]
        for name, value in sorted(build_args.items()):
            args += ["--build-arg", f"{name}={value}"]
        return steps.run(
            self.command(*args, *extra, str(context)),
            label=label,
            log=log,
            out=out,
            hint=f"the Dockerfile's own error is above; rerun by hand with `{' '.join(self.command('bud'))} ...`",
        )

    def push_oci_archive(self, ref: str, dest: Path, name: str, *, log: Path, out: Printer) -> float:
        """Write image ``ref`` to ``dest`` as an OCI archive whose index names it ``name``."""
        return steps.run(
            self.command("push", ref, f"oci-archive:{dest}:{name}"),
            label=f"export {name}",
            log=log,
            out=out,
        )

    def remove_image(self, ref: str) -> None:
        """Untag/remove ``ref`` from this storage (no error when it is not there)."""
        subprocess.run(self.command("rmi", "-f", ref), capture_output=True, check=False)
