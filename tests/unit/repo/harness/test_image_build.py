"""e2e.images: the cache key, the Dockerfile parsing, the archive naming and the builder's errors."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from e2e.images import archive, base, buildah, context

REPO = Path(__file__).resolve().parents[4]

DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE} AS build
COPY pyproject.toml README.md ./
COPY --chmod=0644 pkg ./pkg
RUN pip wheel .
FROM ${BASE_IMAGE}
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \\
    pip install gpuplane
COPY --from=build /src/x /x
COPY extra/tool \\
     /opt/tool
"""


def make_context(tmp_path: Path) -> Path:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nversion = '1'\n")
    (tmp_path / "README.md").write_text("readme\n")
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    return tmp_path


def key(ctx: Path, **args: str) -> str:
    return context.cache_key(
        ctx / "Dockerfile", ctx, build_args=args or {"BASE_IMAGE": "b"}, base_image_id=args.get("_id", "id1")
    )


class TestContext:
    def test_sources_are_the_context_paths_of_copy(self) -> None:
        assert context.context_sources(DOCKERFILE) == ["pyproject.toml", "README.md", "pkg", "extra/tool"]

    def test_the_real_dockerfiles_copy_only_what_the_dockerignore_lets_in(self) -> None:
        allowed = {
            "pyproject.toml",
            "README.md",
            "requirements/runtime.lock",
            "gpuplane",
            "tests/fakes/nvidia-cuda-mps-control",
            "tests/fakes/nvidia-imex",
            "tests/fakes/nvidia-imex-ctl",
        }
        for name in ("Dockerfile.driver", "Dockerfile.controller"):
            assert set(context.context_sources((REPO / name).read_text())) <= allowed
        ignore = (REPO / ".dockerignore").read_text().splitlines()
        assert {f"!{a}" for a in allowed} <= set(ignore)
        assert {"**/__pycache__", "**/*.pyc"} <= set(ignore)

    def test_key_follows_every_input(self, tmp_path: Path) -> None:
        ctx = make_context(tmp_path)
        first = key(ctx)
        assert key(ctx) == first
        (ctx / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"changed")
        assert key(ctx) == first  # what the .dockerignore drops does not count
        (ctx / "unrelated.txt").write_text("not copied")
        assert key(ctx) == first
        (ctx / "pkg" / "mod.py").write_text("x = 2\n")
        second = key(ctx)
        assert second != first
        os.chmod(ctx / "extra" / "tool", 0o755)
        assert key(ctx) != second
        assert key(ctx, BASE_IMAGE="other") != key(ctx)
        third = key(ctx)
        assert context.cache_key(ctx / "Dockerfile", ctx, build_args={"BASE_IMAGE": "b"}, base_image_id="id2") != third
        (ctx / ".dockerignore").write_text("*\n")
        assert key(ctx) != third

    def test_a_missing_source_is_a_clear_error(self, tmp_path: Path) -> None:
        ctx = make_context(tmp_path)
        (ctx / "extra" / "tool").unlink()
        with pytest.raises(context.ContextError, match="extra/tool"):
            key(ctx)


def oci_archive(path: Path) -> None:
    layer = b"layer-bytes"
    manifest = json.dumps(
        {
            "layers": [
                {
                    "digest": "sha256:" + hashlib.sha256(layer).hexdigest(),
                    "size": 11,
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                }
            ]
        }
    ).encode()
    mdigest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = {
        "schemaVersion": 2,
        "manifests": [{"digest": mdigest, "size": len(manifest), "annotations": {archive.REF_NAME: "x:1"}}],
    }
    with tarfile.open(path, "w") as tar:
        for name, data in (
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
            (f"blobs/sha256/{mdigest[7:]}", manifest),
            (f"blobs/sha256/{hashlib.sha256(layer).hexdigest()}", layer),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class TestArchive:
    def test_each_name_is_an_index_entry_of_the_same_manifest(self, tmp_path: Path) -> None:
        src, dest = tmp_path / "src.tar", tmp_path / "dest.tar"
        oci_archive(src)
        archive.name_images(src, dest, ["localhost/x:dev", "localhost/x:1-abc"])
        assert archive.names(dest) == ["localhost/x:dev", "localhost/x:1-abc"]
        index = archive.read_index(dest)
        assert len({m["digest"] for m in index["manifests"]}) == 1
        assert all(
            m["annotations"][archive.REF_NAME] == m["annotations"][archive.IMAGE_NAME] for m in index["manifests"]
        )
        assert archive.sizes(dest) == archive.Sizes(11, 11)
        with tarfile.open(dest) as tar, tarfile.open(src) as original:
            assert sorted(tar.getnames()) == sorted(original.getnames())

    def test_an_image_needs_a_name(self, tmp_path: Path) -> None:
        oci_archive(tmp_path / "a.tar")
        with pytest.raises(ValueError, match="name"):
            archive.name_images(tmp_path / "a.tar", tmp_path / "b.tar", [])


class TestBuilder:
    def test_missing_buildah_names_the_apt_command(self, tmp_path: Path) -> None:
        with pytest.raises(buildah.BuilderMissing, match="apt-get install -y --no-install-recommends buildah"):
            buildah.Buildah.find(tmp_path, {"PATH": str(tmp_path)})

    def test_storage_stays_in_the_cache(self, tmp_path: Path) -> None:
        fake = tmp_path / "bin" / "buildah"
        fake.parent.mkdir()
        fake.write_text("#!/bin/sh\n")
        fake.chmod(0o755)
        if os.geteuid() != 0:
            pytest.skip("the builder needs root")
        b = buildah.Buildah.find(tmp_path / "cache", {"PATH": str(fake.parent)})
        cmd = b.command("images")
        assert cmd[:7] == [
            str(fake),
            "--root",
            str(tmp_path / "cache" / "buildah" / "storage"),
            "--runroot",
            str(tmp_path / "cache" / "buildah" / "run"),
            "--storage-driver",
            "overlay",
        ]


class TestBase:
    def test_recipe_is_slim_and_trusts_the_local_cas(self, tmp_path: Path) -> None:
        ca = tmp_path / "proxy.crt"
        ca.write_text("-----BEGIN CERTIFICATE-----\n")
        cmd = base.mmdebstrap_command(tmp_path / "rootfs.tar", [ca])
        joined = " ".join(cmd)
        assert "--variant=essential" in cmd
        assert "--include=python3,python3-pip,libstdc++6,ca-certificates" in cmd
        assert "path-exclude=/usr/share/man/*" in joined and "path-exclude=/usr/share/locale/*" in joined
        assert "EXTERNALLY-MANAGED" in joined
        assert f"copy-in {ca} /usr/local/share/ca-certificates/" in joined
        assert not any(p in joined for p in ("gcc", "build-essential", "python3-dev"))

    def test_key_changes_with_the_cas(self, tmp_path: Path) -> None:
        ca = tmp_path / "a.crt"
        ca.write_text("one")
        first = base.recipe_key([ca])
        ca.write_text("two")
        assert base.recipe_key([ca]) != first
        assert base.recipe_key([]) != first


class TestSteps:
    def test_a_failing_step_says_what_failed_and_shows_its_output(self, tmp_path: Path) -> None:
        from e2e.images import steps

        shown: list[str] = []
        with pytest.raises(steps.StepError) as err:
            steps.run(
                ["sh", "-c", "echo 'STEP 1/2: FROM x'; echo boom >&2; exit 3"],
                label="probe",
                log=tmp_path / "log",
                out=shown.append,
                hint="try again",
            )
        text = str(err.value)
        assert "exit code 3" in text and "try again" in text and "boom" in text and str(tmp_path / "log") in text
        assert shown == ["  probe: STEP 1/2: FROM x"]  # progress lines are echoed, the rest only logged
        assert "boom" in (tmp_path / "log").read_text()


class TestPrune:
    def test_only_the_newest_archives_of_an_image_stay(self, tmp_path: Path) -> None:
        from e2e.images import build

        for i in range(6):
            path = tmp_path / f"gpuplane-driver-{i:016x}.oci.tar"
            path.write_bytes(b"x")
            os.utime(path, (1000 + i, 1000 + i))
        other = tmp_path / "gpuplane-controller-0000000000000000.oci.tar"
        other.write_bytes(b"x")
        os.utime(other, (1, 1))
        removed = build.prune_archives(tmp_path, "gpuplane-driver", keep=4, out=lambda _: None)
        assert sorted(p.name for p in removed) == [f"gpuplane-driver-{i:016x}.oci.tar" for i in (0, 1)]
        assert other.exists()
        assert len(list(tmp_path.glob("gpuplane-driver-*.oci.tar"))) == 4

    def test_an_archive_used_in_this_run_outlives_newer_builds(self, tmp_path: Path) -> None:
        """N-1's old archive is a cache hit, then N's build prunes: N-1's must stay for its import."""
        from e2e.images import build

        paths = [tmp_path / f"gpuplane-driver-{i:016x}.oci.tar" for i in range(5)]
        for i, path in enumerate(paths):
            path.write_bytes(b"x")
            os.utime(path, (1000 + i, 1000 + i))
        assert build.cache_hit(paths[0])  # the oldest, used now
        assert not build.cache_hit(tmp_path / "gpuplane-driver-ffffffffffffffff.oci.tar")
        removed = build.prune_archives(tmp_path, "gpuplane-driver", keep=4, out=lambda _: None)
        assert removed == [paths[1]] and paths[0].exists()
