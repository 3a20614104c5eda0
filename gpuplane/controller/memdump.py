"""A memory report on demand: ``kill -USR2 <pid>`` writes what the controller's memory is made of.

For an operator asking "why is the controller this big on my fleet" without a debugger: the
report goes to the log (event ``memory report``) and, where the file system is writable, to
``gpuplane-controller-memory-<pid>.txt`` in the directory given at start (by default the system's
temporary directory). It holds

* resident and peak resident memory (``/proc/self/status``);
* what the C allocator holds (glibc's ``mallinfo2``, all arenas): in use, and free but kept from
  the system; then what ``malloc_trim(0)`` gives back, RSS before and after (a large drop says the
  peak is allocator fragmentation, which ``MALLOC_ARENA_MAX`` or a trim address, not live data);
* the live objects the garbage collector tracks, by type: count and shallow bytes (the types
  name what holds the memory: kopf's per-object bookkeeping, index entries, decoded bodies);
* the live dicts by their keys (a decoded body, a condition, an index entry: whose dicts they are);
* where the live memory was allocated, by source line and by call path, when the process runs
  with allocation tracing (``PYTHONTRACEMALLOC=<frames>`` in its environment; it costs CPU and
  memory, so it is for a diagnosis run, never on by default).

The report is written by the signal handler in the main thread (the supervisor's thread, which
only waits); the operator's event loop thread shares the interpreter with it meanwhile, so it runs
slower, not stopped, for the seconds a report takes at fleet scale.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import os
import signal
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

import structlog

log = structlog.get_logger(__name__)
TOP_TYPES = 30
TOP_SITES = 40
TOP_CLASSES = 8  # pymalloc size classes listed, most free bytes first
TOP_DICT_SHAPES = 20
SHAPE_KEYS = 8  # a dict of more keys is named by its size and first keys


def _status_kb(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        ("arena", ctypes.c_size_t),
        ("ordblks", ctypes.c_size_t),
        ("smblks", ctypes.c_size_t),
        ("hblks", ctypes.c_size_t),
        ("hblkhd", ctypes.c_size_t),
        ("usmblks", ctypes.c_size_t),
        ("fsmblks", ctypes.c_size_t),
        ("uordblks", ctypes.c_size_t),
        ("fordblks", ctypes.c_size_t),
        ("keepcost", ctypes.c_size_t),
    ]


def _glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc 2.33+ (``mallinfo2``), else None."""
    try:
        lib = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(lib, "mallinfo2") or not hasattr(lib, "malloc_trim"):
        return None
    lib.mallinfo2.restype = _MallInfo2
    lib.malloc_trim.argtypes = [ctypes.c_size_t]
    return lib


def malloc_rows(trim: bool = True) -> list[str]:
    """What the C allocator holds, and (``trim``) what ``malloc_trim(0)`` returns to the system."""
    lib = _glibc()
    if lib is None:
        return ["C allocator: not glibc 2.33+, no figures"]
    info = lib.mallinfo2()
    rows = [
        f"C allocator (glibc, all arenas): heap {info.arena / 1e6:.1f} MB from the system, "
        f"{info.uordblks / 1e6:.1f} MB in use, {info.fordblks / 1e6:.1f} MB free but held; "
        f"{info.hblkhd / 1e6:.1f} MB in {info.hblks} mmap'd blocks (Python's small-object arenas are "
        "not in these figures)"
    ]
    if trim:
        before = _status_kb("VmRSS") / 1024
        lib.malloc_trim(0)
        after = _status_kb("VmRSS") / 1024
        rows.append(f"malloc_trim(0): RSS {before:.1f} -> {after:.1f} MB (returned {before - after:.1f} MB)")
    return rows


PYMALLOC_KEYS = (
    "# arenas allocated current",
    "# arenas highwater mark",
    "# bytes in allocated blocks",
    "# bytes in available blocks",
    "unused pools",
    "# bytes lost to quantization",
)


def pymalloc_rows() -> list[str]:
    """Python's small-object allocator (``sys._debugmallocstats``): arenas held, bytes in live blocks and free.

    Arenas hold every object of up to 512 bytes; one is given back only when all of it is free, so a
    peak of short-lived objects (a page of a list being decoded) can leave arenas held by the few
    objects that outlived it: "available blocks" and "unused pools" large against "allocated blocks".
    CPython prints these figures to the C stream of file descriptor 2; it is pointed at a pipe for the
    call (anything another thread writes to standard error meanwhile lands in the pipe and is dropped).
    """
    read_fd, write_fd = os.pipe()
    chunks: list[bytes] = []

    def drain() -> None:  # read as it is written: a full pipe must never block the call
        with os.fdopen(read_fd, "rb") as pipe:
            chunks.extend(iter(lambda: pipe.read(65536), b""))

    reader = threading.Thread(target=drain, name="pymalloc-stats", daemon=True)
    reader.start()
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        os.dup2(write_fd, 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write_fd)
    reader.join(timeout=10)
    text = b"".join(chunks).decode(errors="replace")
    rows = [" ".join(line.split()) for line in text.splitlines() if any(k in line for k in PYMALLOC_KEYS)]
    classes = []  # (size, blocks in use, free blocks) of each size class
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 5 and all(c.isdigit() for c in cells):
            classes.append((int(cells[1]), int(cells[3]), int(cells[4])))
    worst = sorted(classes, key=lambda c: -c[0] * c[2])[:TOP_CLASSES]
    rows += [
        f"size {size:>3} B: {size * used / 1e6:6.1f} MB in use, {size * free / 1e6:6.1f} MB free in its pools"
        for size, used, free in worst
        if free
    ]
    return ["Python's small-object allocator (pymalloc):", *(f"  {r}" for r in rows)] if rows else []


def type_table(objects: Iterable[object], top: int = TOP_TYPES) -> list[str]:
    """Rows ``count  shallow-MB  type`` for the ``top`` types by shallow bytes."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for o in objects:
        t = type(o)
        key = f"{t.__module__}.{t.__qualname__}"
        counts[key] += 1
        with contextlib.suppress(TypeError):  # an object whose __sizeof__ refuses: counted, not sized
            sizes[key] += sys.getsizeof(o)
    return [f"{counts[k]:>10}  {sizes[k] / 1e6:9.2f} MB  {k}" for k, _ in sizes.most_common(top)]


def dict_shapes(objects: Iterable[object], top: int = TOP_DICT_SHAPES) -> list[str]:
    """Rows ``count  shallow-MB  keys`` for the ``top`` key sets of live dicts, by count.

    The type table says "dict"; the keys say whose: a decoded object body (``apiVersion, kind,
    metadata, ...``), a container or a condition inside one, an index entry, a handler's kwargs.
    Dicts of more than :data:`SHAPE_KEYS` keys are named by their size and first keys.
    """
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for o in objects:
        if type(o) is not dict:
            continue
        keys = [k if isinstance(k, str) else type(k).__name__ for k in itertools.islice(o, SHAPE_KEYS + 1)]
        if len(keys) > SHAPE_KEYS:
            shape = f"{len(o)} keys: {', '.join(keys[:3])}, ..."[:100]
        else:
            shape = (", ".join(sorted(keys)) or "(empty)")[:100]
        counts[shape] += 1
        sizes[shape] += sys.getsizeof(o)
    return [f"{n:>10}  {sizes[k] / 1e6:9.2f} MB  {{{k}}}" for k, n in counts.most_common(top)]


def site_tables(snapshot: tracemalloc.Snapshot, top: int = TOP_SITES) -> list[str]:
    """The live allocations by source line, then by call path (as deep as the tracing keeps)."""
    rows = ["## allocated at (by line)"]
    for s in snapshot.statistics("lineno")[:top]:
        rows.append(f"{s.size / 1e6:9.2f} MB {s.count:>9}  {s.traceback[0]}")
    rows.append("")
    rows.append("## allocated at (by call path, innermost first)")
    for s in snapshot.statistics("traceback")[: top // 2]:
        rows.append(f"{s.size / 1e6:9.2f} MB {s.count:>9}")
        rows.extend(f"      {frame}" for frame in s.traceback)
    return rows


def report() -> str:
    """The whole report as text."""
    t0 = time.monotonic()
    gc.collect()
    rows = [
        f"# gpuplane-controller memory, pid {os.getpid()}, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"RSS {_status_kb('VmRSS') / 1024:.1f} MB, peak {_status_kb('VmHWM') / 1024:.1f} MB",
        *malloc_rows(),
        *pymalloc_rows(),
        "",
    ]
    objects = gc.get_objects()
    rows += [
        "## live objects by type (gc-tracked; count, shallow size)",
        *type_table(objects),
        "",
        "## live dicts by their keys (count, shallow size)",
        *dict_shapes(objects),
        "",
    ]
    del objects
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        rows.append(f"traced: {current / 1e6:.1f} MB now, {peak / 1e6:.1f} MB peak")
        rows.extend(site_tables(tracemalloc.take_snapshot()))
    else:
        rows.append("allocation sites: not traced (start the process with PYTHONTRACEMALLOC=<frames> for them)")
    rows.append(f"(report took {time.monotonic() - t0:.1f} s)")
    return "\n".join(rows) + "\n"


def write(directory: Path, text: str | None = None) -> Path:
    """Write the report (or ``text``) into ``directory`` (atomically) and return its path."""
    path = directory / f"gpuplane-controller-memory-{os.getpid()}.txt"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(report() if text is None else text)
    tmp.replace(path)
    return path


def _default_directory() -> Path | None:
    """The system's temporary directory, or None where there is none (a read-only root file system)."""
    try:
        return Path(tempfile.gettempdir())
    except OSError:  # tempfile found no writable directory: the report goes to the log only
        return None


def install(directory: Path | None = None) -> None:
    """SIGUSR2 logs the report and writes it to a file where the file system allows (main thread only).

    In the Deployment the root file system is read-only, so there the log (``kubectl logs``) has it.
    Nothing is looked up at install: a process with no writable directory must start as any other.
    """

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        try:
            text = report()
        except Exception as exc:  # a report must never take the controller down
            log.warning("memory report failed", error=repr(exc))
            return
        where = directory if directory is not None else _default_directory()
        path: str | None = None
        if where is not None:
            try:
                path = str(write(where, text))
            except OSError as exc:
                log.info("memory report not written to a file", directory=str(where), error=repr(exc))
        log.info("memory report", path=path, report=text)

    signal.signal(signal.SIGUSR2, on_signal)
