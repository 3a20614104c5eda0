"""The C allocator's settings for a long-lived controller: few arenas, free pages given back.

Two measured sources of resident memory that hold no live data (the memory report,
:mod:`gpuplane.controller.memdump`, on a 1,000-node fleet with 10,000 claims: glibc's heap 57 MB,
21 MB of it free but held, 11 MB returned by one ``malloc_trim(0)``):

* glibc gives each thread that allocates its own arena, up to eight per CPU; the controller's
  threads (kopf's loop, the thread pool of ``asyncio.to_thread``, the Lease renewer, the steering
  write pool, the metrics server) each fragment one. :func:`configure` caps them at
  :data:`ARENAS` (``mallopt(M_ARENA_MAX)``) before any thread starts, as ``MALLOC_ARENA_MAX``
  would from the environment (an environment value, when set, is left as it is);
* glibc trims only the top of a heap by itself: free pages in the middle stay resident after a
  peak (the start-up listing of every slice and claim). :func:`trim_loop` calls
  ``malloc_trim(0)`` once the start-up indexing is done and every :data:`TRIM_EVERY_S` after that,
  which gives those pages back; a call takes milliseconds.

On a C library other than glibc (2.33 or later) both do nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger(__name__)

ARENAS = 2  # malloc arenas for the whole process (glibc's default: 8 per CPU)
M_ARENA_MAX = -8  # mallopt parameter (glibc's malloc.h)
TRIM_AFTER_START_S = 30.0  # after the start-up barrier opened: the deferred replay is done by then
TRIM_EVERY_S = 300.0


def _glibc() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(lib, "mallopt") or not hasattr(lib, "malloc_trim") or not hasattr(lib, "mallinfo2"):
        return None
    lib.malloc_trim.argtypes = [ctypes.c_size_t]
    lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return lib


def configure(environ: dict[str, str] | None = None) -> bool:
    """Cap the malloc arenas (unless ``MALLOC_ARENA_MAX`` is set); True when the cap was set here."""
    env = os.environ if environ is None else environ
    lib = _glibc()
    if lib is None or "MALLOC_ARENA_MAX" in env:
        return False
    return bool(lib.mallopt(M_ARENA_MAX, ARENAS))


def trim() -> bool:
    """Give the C heap's free pages back to the system; True when glibc did (it says whether any went)."""
    lib = _glibc()
    return lib is not None and bool(lib.malloc_trim(0))


async def trim_loop(
    ready: Callable[[], Awaitable[None]],
    *,
    first_s: float = TRIM_AFTER_START_S,
    every_s: float = TRIM_EVERY_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """After ``ready`` (the start-up barrier) and ``first_s``, trim; then every ``every_s``."""
    await ready()
    await sleep(first_s)
    while True:
        released = await asyncio.to_thread(trim)
        log.debug("malloc_trim", released=released)
        await sleep(every_s)
