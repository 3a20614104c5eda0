"""The fleet map as HTML (gpuplane.cli.fleethtml): its structure, its escaping, and its rendering in a real browser.

The page is parsed (html.parser) for what it must say: one row per GPU with one cell per memory slice,
each held cell's tooltip naming its claim, the taint, the free block, the usage table; a hostile claim
name stays text. Then Debian's headless Chromium renders it and the screenshot's pixels are counted: the
claims' colours and the free cells' grey are on screen, in proportion to the cells they fill. The
screenshot is kept (``GPUPLANE_ARTEFACTS`` or the test's tmp dir) to be looked at.
"""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from gpuplane.cli import fleethtml, fleetmap
from tests import browserkit
from tests.unit.cli.test_fleetmap import CLAIMS, _slices, claim


class Cells(HTMLParser):
    """Collects the page's rows of cells (each cell's class and title) and its visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, str]]] = []
        self.text: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        got = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag == "div" and got.get("class") == "cells":
            self.rows.append([])
        elif tag == "div" and (got.get("class") or "").startswith("cell"):
            self.rows[-1].append((got.get("class") or "", got.get("title") or ""))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def slices() -> list[dict[str, Any]]:
    out = _slices()
    for s in out:
        for d in s["spec"].get("devices") or []:
            if d["name"] == "gpu-3":
                d["taints"] = [{"key": "gpu.gpuplane.dev/xid", "value": "79", "effect": "NoSchedule"}]
    return out


def _page(slices: list[dict[str, Any]], claims: list[dict[str, Any]]) -> str:
    return fleethtml.render(fleetmap.build(slices, claims), generated="generated at test", price_per_gpu_hour=2.5)


def test_the_page_has_a_row_per_gpu_and_a_cell_per_memory_slice(slices: list[dict[str, Any]]) -> None:
    page = Cells()
    page.feed(_page(slices, CLAIMS))
    assert len(page.rows) == 8 and all(len(row) == 8 for row in page.rows)
    gpu0, gpu1, gpu2 = page.rows[0], page.rows[1], page.rows[2]
    assert [t for _, t in gpu0[:4]] == ["team-a/big: 3g.40gb (exclusive)"] * 4
    assert [t for _, t in gpu0[4:6]] == ["team-b/small: 2g.20gb (exclusive)"] * 2
    assert [c for c, _ in gpu0[6:]] == ["cell free"] * 2
    assert {t for _, t in gpu1} == {"team-c/train: whole GPU (exclusive)"}
    assert [t.split(":")[0] for _, t in gpu2] == ["serve/gold"] * 5 + ["batch/bronze"] + ["free"] * 2
    text = " ".join(page.text)
    assert "taint gpu.gpuplane.dev/xid=79:NoSchedule" in text and "largest free: 1g.20gb @6" in text
    assert "1 nodes, 8 GPUs: 5 free" in text and "Usage per namespace" in text and page.scripts == 0


def test_hostile_names_are_text(slices: list[dict[str, Any]]) -> None:
    hostile = claim("team-x", "<script>alert(1)</script>", "gpu-4", cls="gpu.gpuplane.dev")
    html = _page(slices, [hostile])
    page = Cells()
    page.feed(html)
    assert "<script>" not in html and page.scripts == 0
    assert "team-x/&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_chromium_renders_the_map_in_the_claims_colours(slices: list[dict[str, Any]], tmp_path: Path) -> None:
    html = tmp_path / "fleet.html"
    html.write_text(_page(slices, CLAIMS))
    out = Path(os.environ.get("GPUPLANE_ARTEFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    png = out / "fleet-map-unit.png"
    browserkit.screenshot(html, png, width=1400, height=700)
    seen = browserkit.colours(browserkit.read_png(png))
    red = seen[browserkit.hex_pixel(fleethtml.CSS_COLOURS[31])]  # the first claim on each GPU: A
    green = seen[browserkit.hex_pixel(fleethtml.CSS_COLOURS[32])]  # the second: B
    grey = seen[browserkit.hex_pixel(fleethtml.FREE)]
    print(f"\n[unit] screenshot {png}: red {red} px, green {green} px, free grey {grey} px")
    # Solid cells: gpu-0 4 A + 2 B, gpu-1 8 A (gpu-2's striped cells mix colours); swatches add a little.
    assert red > 0 and green > 0 and grey > 0
    assert red > 2 * green, (red, green)  # 12 solid red cells against 2 solid green ones
    assert grey > red, (grey, red)  # 42 free cells
