"""Responses of the kubernetes Python client read through the bounded JSON decoder.

The client decodes every response with ``json.loads`` (``ApiClient.deserialize``),
which recurses once per nesting level: reading, patching or listing one claim
nested ~1,000 levels deep raised ``RecursionError`` in the driver and the
controller. Calls made with ``_preload_content=False`` return the raw urllib3
response instead (non-2xx statuses still raise ``ApiException``); these helpers
read it with :mod:`gpuplane.api.boundedjson` (:func:`read_object`, :func:`read_list`)
or drain it unread (:func:`discard`, for writes whose answer nobody needs), and
always give the connection back to the pool.
"""

from __future__ import annotations

from typing import Any

from gpuplane.api import boundedjson


def _body(response: Any) -> bytes:
    """The whole body of a urllib3 response (``.data`` reads it once), the connection released."""
    if isinstance(response, bytes | bytearray | str):
        return response.encode() if isinstance(response, str) else bytes(response)
    try:
        data = getattr(response, "data", None)
        return bytes(data or b"")
    finally:
        release = getattr(response, "release_conn", None)
        if callable(release):
            release()


def read_object(response: Any, max_depth: int = boundedjson.MAX_OBJECT_DEPTH) -> Any:
    """One object; quarantined (see :func:`gpuplane.api.boundedjson.quarantine`) when nested too deeply."""
    return boundedjson.decode_object(_body(response), max_depth)


def read_list(response: Any, max_depth: int = boundedjson.MAX_OBJECT_DEPTH) -> Any:
    """A list; each item nested too deeply is quarantined, the others are intact."""
    return boundedjson.decode_list(_body(response), max_depth)


def discard(response: Any) -> None:
    """Drain a write's response without decoding it."""
    _body(response)
