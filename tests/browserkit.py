"""A real headless browser for the rendering tests: Debian's Chromium, and a PNG reader for its screenshots.

``screenshot(html_file, png_file)`` renders a page with ``chromium --headless --screenshot`` (as root it
needs ``--no-sandbox``); ``read_png`` decodes the 8-bit RGB or RGBA, non-interlaced PNG Chromium writes
(the five scanline filters of the PNG specification) into rows of (r, g, b) so that a test can count
the pixels of a colour. ``chromium_or_skip`` skips where Chromium is absent, except in CI
(``GPUPLANE_REAL_NODES=required`` or ``CI``), where a missing browser fails the test: ``scripts/setup-browser.sh``
installs it.
"""

from __future__ import annotations

import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

from e2e.plane import fleetpage
from tests import hosttools

Pixel = tuple[int, int, int]


def chromium_or_skip() -> str:
    """The Chromium executable; a skip (locally) or a failure (CI) without one."""
    return hosttools.required_tool(
        "chromium", "chromium-browser", installer="scripts/setup-browser.sh", what="Debian's chromium package"
    )


def screenshot(html: Path, png: Path, width: int = 1400, height: int = 900) -> None:
    """Render ``html`` in headless Chromium and write a ``width`` x ``height`` screenshot to ``png``."""
    argv = fleetpage.screenshot_argv(chromium_or_skip(), html, png, width, height)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and png.is_file(), f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"


def _unfilter(kind: int, line: bytearray, prior: bytes, bpp: int) -> None:
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        up = prior[i]
        corner = prior[i - bpp] if i >= bpp else 0
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + up) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 0xFF
        elif kind == 4:
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
            line[i] = (line[i] + best) & 0xFF


def read_png(path: Path) -> list[list[Pixel]]:
    """Rows of (r, g, b) pixels of an 8-bit RGB or RGBA, non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unsupported PNG: depth {depth}, colour {colour}"
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[list[Pixel]] = []
    prior = bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter(raw[start], line, prior, bpp)
        rows.append([(line[x], line[x + 1], line[x + 2]) for x in range(0, stride, bpp)])
        prior = bytes(line)
    return rows


def colours(rows: list[list[Pixel]]) -> Counter[Pixel]:
    """How many pixels of each colour."""
    return Counter(p for row in rows for p in row)


def hex_pixel(css: str) -> Pixel:
    """``#d62728`` -> (214, 39, 40)."""
    return int(css[1:3], 16), int(css[3:5], 16), int(css[5:7], 16)
