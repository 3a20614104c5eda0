"""gpuplane.api.kubetime: the API's times read from any field (None, never an error) and written as it writes them."""

from __future__ import annotations

import pytest

from gpuplane.api import kubetime

T = 1_765_000_000.25  # 2025-12-06T05:46:40.25Z


def test_a_time_and_a_microtime_round_trip() -> None:
    assert kubetime.rfc3339(T) == "2025-12-06T05:46:40Z"
    assert kubetime.rfc3339(T, micro=True) == "2025-12-06T05:46:40.250000Z"
    assert kubetime.epoch(kubetime.rfc3339(T, micro=True)) == pytest.approx(T)
    assert kubetime.epoch(kubetime.rfc3339(T)) == int(T)
    assert kubetime.epoch("2025-12-06T06:46:40+01:00") == int(T)  # another zone, the same moment
    assert kubetime.epoch("2025-12-06T05:46:40") == int(T)  # no zone: UTC, whatever this machine's zone


@pytest.mark.parametrize("value", [None, "", "yesterday", "2025-13-01T00:00:00Z", 1765000000, ["2025-12-06T05:46:40Z"]])
def test_a_field_that_is_not_a_time_reads_as_none(value: object) -> None:
    assert kubetime.epoch(value) is None
