"""What the plugin server tests share: a table-driven preparer, the server on short socket paths, fixtures."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from gpuplane.driver.observe import health_board, health_view
from gpuplane.driver.plugin import kubelet_client, server
from gpuplane.driver.prepare import contract

DRIVER = "gpu.gpuplane.dev"
V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"


def claim_ref(i: int) -> contract.ClaimRef:
    return contract.ClaimRef(namespace="ns", uid=f"uid-{i}", name=f"claim-{i}")


def prepared_devices(n: int, share: bool) -> tuple[contract.PreparedDevice, ...]:
    return tuple(
        contract.PreparedDevice(
            request_names=("gpu",) if i % 2 else ("gpu", "extra"),
            pool_name="node-a",
            device_name=f"gpu-{i}",
            cdi_device_ids=(f"gpuplane.dev/gpu=gpu-{i}", f"gpuplane.dev/gpu=common-{i}"),
            share_id=f"share-{i}" if share else None,
        )
        for i in range(n)
    )


class FakePreparer:
    """Answers from a table; can fail claims, omit them, or raise for a whole batch."""

    def __init__(self) -> None:
        self.prepared: dict[str, contract.PrepareResult] = {}
        self.unprepare_errors: dict[str, str] = {}
        self.omit: set[str] = set()
        self.raise_on_call = False
        self.delay_s = 0.0  # how long each call takes
        self.calls: list[tuple[str, list[contract.ClaimRef]]] = []

    def prepare(self, claims: Sequence[contract.ClaimRef]) -> Mapping[str, contract.PrepareResult]:
        self.calls.append(("prepare", list(claims)))
        time.sleep(self.delay_s)
        if self.raise_on_call:
            raise RuntimeError("apiserver unreachable")
        return {
            c.uid: self.prepared.get(c.uid, contract.PrepareResult(error=f"unknown claim {c.uid}"))
            for c in claims
            if c.uid not in self.omit
        }

    def unprepare(self, claims: Sequence[contract.ClaimRef]) -> Mapping[str, contract.UnprepareResult]:
        self.calls.append(("unprepare", list(claims)))
        if self.raise_on_call:
            raise RuntimeError("apiserver unreachable")
        return {
            c.uid: contract.UnprepareResult(error=self.unprepare_errors.get(c.uid, ""))
            for c in claims
            if c.uid not in self.omit
        }


@pytest.fixture(name="short_dir")
def short_dir_fixture() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(name="preparer")
def preparer_fixture() -> FakePreparer:
    return FakePreparer()


@pytest.fixture(name="board")
def board_fixture() -> health_board.HealthBoard:
    return health_board.HealthBoard(
        [health_view.DeviceHealthView("node-a", "gpu-0", True, "ok", last_updated=100, timeout_s=30)]
    )


@pytest.fixture(name="timings")
def timings_fixture() -> list[tuple[str, float, int]]:
    return []


@pytest.fixture(name="plugin")
def plugin_fixture(
    short_dir: Path,
    preparer: FakePreparer,
    board: health_board.HealthBoard,
    timings: list[tuple[str, float, int]],
) -> Iterator[server.PluginServer]:
    srv = server.PluginServer(
        DRIVER,
        preparer,
        registry_dir=short_dir / "reg",
        plugin_dir=short_dir / "plugins" / DRIVER,
        health_source=board,
        timing=lambda op, seconds, errors: timings.append((op, seconds, errors)),
        stream_poll_interval=0.05,
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop(grace=1)


def connect(plugin: server.PluginServer, version: str) -> kubelet_client.KubeletPluginClient:
    return kubelet_client.KubeletPluginClient.discover(plugin.registration_socket, timeout=10, force_version=version)
