"""HealthBoard: the in-memory HealthSource behind the DRAResourceHealth stream."""

from __future__ import annotations

import threading

from gpuplane.driver.observe import health_board, health_view
from gpuplane.driver.plugin import health_servicer


def _view(name: str, healthy: bool | None, message: str = "") -> health_view.DeviceHealthView:
    return health_view.DeviceHealthView("pool", name, healthy, message)


def test_snapshot_sorted_and_generation_rises_only_on_change() -> None:
    board = health_board.HealthBoard([_view("b", True), _view("a", True)])
    first = board.snapshot()
    assert [d.device_name for d in first.devices] == ["a", "b"]
    board.update([_view("a", True)])  # no change
    assert board.snapshot().generation == first.generation
    board.update([_view("a", False, "XID 48")])
    assert board.snapshot().generation == first.generation + 1
    board.replace([_view("c", None)])
    assert [d.device_name for d in board.snapshot().devices] == ["c"]


def test_wait_changed_times_out_and_wakes() -> None:
    board = health_board.HealthBoard()
    generation = board.snapshot().generation
    assert board.wait_changed(generation, timeout=0.01) is False
    timer = threading.Timer(0.05, board.update, args=([_view("a", True)],))
    timer.start()
    assert board.wait_changed(generation, timeout=5) is True
    timer.join()
    assert board.wait_changed(generation, timeout=0) is True  # already differs


def test_wire_status_round_trip() -> None:
    for healthy in (True, False, None):
        assert health_servicer.from_wire_status(health_servicer.to_wire_status(healthy)) is healthy
    snapshot = health_view.HealthSnapshot(1, (health_view.DeviceHealthView("p", "d", False, "hot", 5, 60),))
    wire = health_servicer.to_response(snapshot).devices[0]
    assert (wire.device.pool_name, wire.device.device_name, wire.message) == ("p", "d", "hot")
    assert (wire.last_updated_time, wire.health_check_timeout_seconds) == (5, 60)
