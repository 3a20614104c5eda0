"""The fleet map's page as a picture: headless Chromium's screenshot of an HTML file (the demo's and the tests').

``screenshot_argv`` is the one command line: ``--headless`` without a GPU, ``--no-sandbox`` (the demo and CI
run as root, where Chromium's sandbox refuses to start), no scrollbars, a fixed window, the page by its
``file://`` URI.
"""

from __future__ import annotations

from pathlib import Path


def screenshot_argv(browser: str, html: Path, png: Path, width: int, height: int) -> list[str]:
    """Chromium's command line that renders ``html`` and writes a ``width`` x ``height`` PNG to ``png``."""
    return [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--screenshot={png}",
        html.resolve().as_uri(),
    ]
