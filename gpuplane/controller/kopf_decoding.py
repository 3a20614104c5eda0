"""kopf reads the API through gpuplane's bounded JSON decoder: no watched object can crash the operator.

kopf decodes watch events with ``json.loads`` in ``kopf._cogs.clients.api.stream``
and lists (and every other response) with aiohttp's ``response.json()`` in
``api.get``/``post``/``patch``/``delete``; a claim nested ~1,000 levels deep made
both raise ``RecursionError``, which kopf treats as a fatal watcher failure, so
every replica stopped. kopf has no public decoding hook, so :func:`install`
replaces exactly those two places, in the one module kopf's watcher and fetcher
call through (``api.stream``, ``api.get``, looked up at call time): the stream's
``json`` becomes a shim whose ``loads`` is :func:`gpuplane.api.boundedjson.decode_event`,
and the four request helpers decode with :func:`gpuplane.api.boundedjson.decode_list`.
An object deeper than the bound reaches the handlers cut and marked with
:data:`gpuplane.api.boundedjson.REJECTED`, which they refuse with an Event.
The same two places apply a transform to every decoded object (:mod:`gpuplane.controller.slim`).
``tests/unit/test_kopf_decoding.py`` drives kopf's own stream and fetch functions
against an HTTP server, so a kopf release that moves these calls fails the tests
instead of silently bypassing the bound.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from kopf._cogs.clients import api as kopf_api

from gpuplane.api import boundedjson

_MARK = "_gpuplane_bounded_json"
_TRANSFORM = "_gpuplane_transform"


Transform = Callable[..., Any]  # (object, kind='') -> what kopf keeps of it (gpuplane.controller.slim.Slimmer)


def _same(obj: Any, kind: str = "") -> Any:
    del kind
    return obj


class _StreamJson:
    """Stands in for the ``json`` module inside kopf's API client (only ``loads`` is used there)."""

    def __init__(self, max_depth: int, transform: Transform) -> None:
        self.max_depth = max_depth
        self.transform = transform

    def loads(self, text: str | bytes) -> Any:
        """One watch-stream line: an event whose too-deep object is quarantined, then transformed."""
        event = boundedjson.decode_event(text, self.max_depth)
        if isinstance(event, dict) and isinstance(event.get("object"), dict):
            event["object"] = self.transform(event["object"])
        return event


def _transformed(value: Any, transform: Transform) -> Any:
    """A decoded response with ``transform`` applied to its object, or to each item of a list."""
    if not isinstance(value, dict):
        return value
    items = value.get("items")
    if isinstance(items, list):
        kind = str(value.get("kind") or "").removesuffix("List")  # list items do not say their kind
        value["items"] = [transform(item, kind) for item in items]
        return value
    return transform(value)


def _bounded(method: str, max_depth: int, transform: Transform) -> Callable[..., Coroutine[Any, Any, Any]]:
    async def call(url: str, **kwargs: Any) -> Any:
        response = await kopf_api.request(method, url, **kwargs)
        async with response:
            raw = await response.read()
        if not raw.strip():
            return None  # as aiohttp's response.json() answers an empty body
        return _transformed(boundedjson.decode_list(raw, max_depth), transform)

    call.__name__ = call.__qualname__ = method
    return call


def install(max_depth: int = boundedjson.MAX_OBJECT_DEPTH, transform: Transform | None = None) -> None:
    """Route kopf's response decoding through the bounded decoder (idempotent for one bound and transform).

    ``transform`` (e.g. :class:`gpuplane.controller.slim.Slimmer`) cuts every decoded object to what
    the controller reads before kopf queues it.
    """
    chosen = transform if transform is not None else _same
    if getattr(kopf_api, _MARK, None) == max_depth and getattr(kopf_api, _TRANSFORM, None) is chosen:
        return
    setattr(kopf_api, "json", _StreamJson(max_depth, chosen))  # noqa: B010 - replacing a module attribute of kopf
    for method in ("get", "post", "patch", "delete"):
        setattr(kopf_api, method, _bounded(method, max_depth, chosen))
    setattr(kopf_api, _MARK, max_depth)
    setattr(kopf_api, _TRANSFORM, chosen)


def installed() -> int | None:
    """The bound kopf decodes with, or None when :func:`install` has not run."""
    value = getattr(kopf_api, _MARK, None)
    return value if isinstance(value, int) else None
