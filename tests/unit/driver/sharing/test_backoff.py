"""driver.sharing.backoff: doubling pauses, capped, never sleeping past the deadline."""

from __future__ import annotations

from gpuplane.driver.sharing.backoff import Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.now += s


def test_pauses_double_to_the_cap_and_the_last_stops_at_the_deadline() -> None:
    c = Clock()
    b = Backoff(1.0, first_s=0.1, cap_s=0.3, clock=c, sleep=c.sleep)
    waits = 0
    while b.wait():
        waits += 1
    assert c.slept == [0.1, 0.2, 0.3, 0.3, 0.1]  # 0.1 + 0.2 + 0.3 + 0.3 = 0.9, then the 0.1 left
    assert waits == 5 and b.expired() and c.now == 101.0
    assert not b.wait() and len(c.slept) == 5  # expired: no more sleeping


def test_a_zero_timeout_never_sleeps() -> None:
    c = Clock()
    b = Backoff(0.0, first_s=0.1, cap_s=1.0, clock=c, sleep=c.sleep)
    assert not b.wait() and c.slept == []
