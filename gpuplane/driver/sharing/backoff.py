"""A deadline and a doubling pause, for the loops that wait on a daemon, a process or a pod.

``Backoff(timeout_s, first_s, cap_s).wait()`` sleeps the next pause (never past the deadline) and
says whether there is time left; the loop checks its condition between pauses.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Backoff:
    """Pauses of ``first_s``, doubling up to ``cap_s``, until ``timeout_s`` from now has passed."""

    def __init__(
        self,
        timeout_s: float,
        first_s: float,
        cap_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock, self._sleep = clock, sleep
        self.deadline = clock() + timeout_s
        self._delay, self._cap = first_s, cap_s

    def expired(self) -> bool:
        return self._clock() >= self.deadline

    def wait(self) -> bool:
        """Sleep the next pause; False (without sleeping) once the deadline has passed."""
        left = self.deadline - self._clock()
        if left <= 0:
            return False
        self._sleep(min(self._delay, left))
        self._delay = min(self._delay * 2, self._cap)
        return True
