"""kopf's paged listing survives an expired continue token: the list starts again instead of the operator stopping.

kopf (1.45) lists every watched resource in pages (``settings.watching.chunk_size``) before it
watches, and again after each watch that ends on "410 Gone". The pages of one list share the
first page's snapshot; the API server keeps that snapshot only until etcd compacts past it
(``--etcd-compaction-interval``, 5 minutes by default). A list consumed more slowly than that
gets "410 Expired: The provided continue parameter is too old" on its next page, and kopf lets
that error out of the watcher, which ends the whole operator. On a 1,000-node KWOK fleet with
10,000 claims the controller's event loop was busy for minutes with a republish of every slice,
the re-list of slices fell that far behind, and the replica exited (docs/benchmarks.md, run 2).

:func:`install` wraps ``kopf._cogs.clients.fetching.fetch_objs`` (kopf's watcher and namespace
observer look it up at call time): an expired continue token starts the same list again from a
new snapshot, without the token, which is what the API server's error asks of a client that
needs a consistent list. Objects already yielded come again; kopf handles a repeated object as
it handles one from any re-list. A list that expires :data:`MAX_RESTARTS` times in a row raises
:class:`ListingFellBehind`, which says what to do. ``tests/unit/test_kopf_listing.py`` drives
kopf's own ``continuous_watch`` against an HTTP server that expires a token.

The same wrapper lists ResourceSlices in pages of :data:`SLICE_PAGE` (kopf's ``chunk_size`` for
everything else): a page is decoded whole before each slice is cut to its digest, and one slice of
an HGX node decodes to about 260 kB of Python objects, so a page of 100 was a 26 MB peak at every
list, and the small objects that outlived it (the digests, the other resources' index entries made
meanwhile) kept that memory's arenas resident (docs/benchmarks.md, "controller memory").
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import structlog
from kopf._cogs.clients import errors, fetching

log = structlog.get_logger(__name__)

SLICE_PAGE = 10  # ResourceSlices per listed page (each up to 128 devices)
MAX_RESTARTS = 10  # consecutive expiries of one list before the replica gives up (~50 min at 5-min compaction)
_ORIGINAL = "_gpuplane_original_fetch_objs"

Fetch = Callable[..., AsyncIterator[tuple[Collection[Any], str]]]


class ListingFellBehind(RuntimeError):
    """The same list expired :data:`MAX_RESTARTS` times in a row: the controller cannot keep up."""


def expired(err: BaseException) -> bool:
    """Whether ``err`` is the API server's answer to a continue token older than its compaction."""
    return isinstance(err, errors.APIError) and err.status == 410


def paged(settings: Any, size: int) -> Any:
    """A copy of kopf's settings that lists in pages of at most ``size`` (the original is shared)."""
    chunk = settings.watching.chunk_size
    if chunk is not None and 0 < chunk <= size:
        return settings
    out = copy.copy(settings)
    out.watching = copy.copy(settings.watching)
    out.watching.chunk_size = size
    return out


def _restarting(fetch: Fetch) -> Fetch:
    async def fetch_objs(**kwargs: Any) -> AsyncIterator[tuple[Collection[Any], str]]:
        resource = kwargs.get("resource")
        if getattr(resource, "plural", None) == "resourceslices" and kwargs.get("settings") is not None:
            kwargs = {**kwargs, "settings": paged(kwargs["settings"], SLICE_PAGE)}
        restarts = 0
        while True:
            pages = 0
            try:
                async for chunk, version in fetch(**kwargs):
                    pages += 1
                    yield chunk, version
                return
            except errors.APIError as err:
                if not expired(err) or pages == 0:  # a first page never carries a token: not ours to retry
                    raise
                restarts += 1
                if restarts > MAX_RESTARTS:
                    raise ListingFellBehind(
                        f"listing {resource} expired {MAX_RESTARTS} times in a row: each list took longer than "
                        "the API server keeps a snapshot (etcd compaction). Give the controller more CPU, or "
                        "raise kube-apiserver's --etcd-compaction-interval; the next replica starts over."
                    ) from err
                log.warning(
                    "listing fell behind the API server's compaction; listing again from a new snapshot",
                    resource=str(resource),
                    pages_read=pages,
                    restart=restarts,
                    max_restarts=MAX_RESTARTS,
                    error=str(err),
                )

    fetch_objs.__doc__ = fetch.__doc__
    return fetch_objs


def install() -> None:
    """Wrap kopf's paged listing so an expired continue token restarts the list (idempotent)."""
    mod: Any = fetching
    if getattr(mod, _ORIGINAL, None) is not None:
        return
    original = mod.fetch_objs
    mod.fetch_objs = _restarting(original)
    setattr(mod, _ORIGINAL, original)


def uninstall() -> None:
    """kopf's listing as released (for tests)."""
    mod: Any = fetching
    original = getattr(mod, _ORIGINAL, None)
    if original is not None:
        mod.fetch_objs = original
        delattr(mod, _ORIGINAL)
