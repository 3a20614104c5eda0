"""The images built from Dockerfile.driver / Dockerfile.controller with buildah (e2e.images), looked into.

Builds (or finds cached) both images on the offline base, then runs commands in
containers made from their OCI archives (what containerd imports) with the same
buildah: the entry points start, the driver image carries the MPS stand-in off
PATH and no compilers, test suites, e2e harness or import package but
``gpuplane``, the controller runs as 65532, and the archives name the images for
containerd. A second ``ensure_images`` is a cache hit.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from e2e.cluster import build as k8sbuild
from e2e.images import archive, buildah
from e2e.images import build as images

pytestmark = pytest.mark.e2e
DRIVER_MAX_MB = 300  # unpacked; the base alone is ~128 MB


@pytest.fixture(scope="module")
def built() -> dict[str, images.BuiltImage]:
    return {b.name: b for b in images.ensure_images(out=print)}


def run_in(image: images.BuiltImage, script: str) -> str:
    """Run ``script`` in a container of the image read back from its archive (the artifact containerd gets)."""
    b = buildah.Buildah.find(k8sbuild.cache_root(os.environ), os.environ)
    source = f"oci-archive:{image.archive}:{image.ref}"
    ctr = subprocess.run(b.command("from", source), capture_output=True, text=True, check=True).stdout.strip()
    try:
        proc = subprocess.run(
            b.command("run", "--isolation", buildah.ISOLATION, ctr, "--", "sh", "-c", script),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout
    finally:
        subprocess.run(b.command("rm", ctr), capture_output=True, check=False)
        b.remove_image(image.ref)


def test_archives_name_both_images(built: dict[str, images.BuiltImage]) -> None:
    for name, image in built.items():
        assert archive.names(image.archive) == [f"localhost/{name}:dev", image.pinned_ref]
        print(f"{name}: {image.sizes.uncompressed / 1e6:.0f} MB unpacked, {image.sizes.compressed / 1e6:.0f} MB gz")
    assert built["gpuplane-driver"].sizes.uncompressed < DRIVER_MAX_MB * 1_000_000


def test_driver_image(built: dict[str, images.BuiltImage]) -> None:
    out = run_in(
        built["gpuplane-driver"],
        "gpuplane-driver --help | head -1; "
        "command -v nvidia-cuda-mps-control || echo 'stand-in off PATH'; "
        "test -x /opt/gpuplane/sim/bin/nvidia-cuda-mps-control && echo stand-in present; "
        "mkdir -p /tmp/p /tmp/l; export CUDA_MPS_PIPE_DIRECTORY=/tmp/p CUDA_MPS_LOG_DIRECTORY=/tmp/l; "
        "/opt/gpuplane/sim/bin/nvidia-cuda-mps-control -d && sleep 1 && "
        "echo get_default_active_thread_percentage | /opt/gpuplane/sim/bin/nvidia-cuda-mps-control; "
        "echo quit | /opt/gpuplane/sim/bin/nvidia-cuda-mps-control; "
        "for c in gcc cc g++ make; do command -v $c; done; "
        'for m in e2e driver controller; do python3 -c "import $m" 2>/dev/null && echo $m-present; done; '
        "find /usr/local/lib -type d -name tests | head -1",
    )
    assert "usage: gpuplane-driver" in out
    assert "stand-in off PATH" in out and "stand-in present" in out
    assert "100.0" in out  # the stand-in daemon answered inside the image
    # One import package, gpuplane: no e2e harness, no top-level driver/controller in the wheel.
    for tool in ("/gcc", "/cc", "/g++", "/make", "e2e-present", "driver-present", "controller-present", "/tests"):
        assert tool not in out, out


def test_controller_image(built: dict[str, images.BuiltImage]) -> None:
    out = run_in(built["gpuplane-controller"], "gpuplane-controller --help | head -1; id -u")
    assert "usage: gpuplane-controller" in out
    assert out.strip().endswith("65532")


def test_second_build_is_a_cache_hit(built: dict[str, images.BuiltImage]) -> None:
    started = time.monotonic()
    again = images.ensure_images(out=print)
    assert all(b.cached for b in again)
    assert [b.archive for b in again] == [built[b.name].archive for b in again]
    print(f"cache hit in {time.monotonic() - started:.1f}s")
