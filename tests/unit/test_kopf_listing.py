"""kopf's own watcher, against a real HTTP server whose continue token expires mid-list.

The server lists ResourceClaims two per page; the second page's token is answered with the API
server's "410 Expired" a set number of times before it is served. kopf as released lets that
error out of ``continuous_watch`` (asserted first, so a kopf that learns to retry shows up here);
with :func:`gpuplane.controller.kopf_listing.install` the list starts again from its first page
and completes, and a list that keeps expiring ends with a message that says what to do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from kopf._cogs.clients import auth, errors, watching
from kopf._cogs.configs import configuration
from kopf._cogs.structs import credentials, references

from gpuplane.controller import kopf_listing

RESOURCE = references.Resource(group="resource.k8s.io", version="v1", plural="resourceclaims", namespaced=True)
EXPIRED = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "reason": "Expired",
    "code": 410,
    "message": "The provided continue parameter is too old to display a consistent list result.",
}


def _page(names: list[str], version: str, token: str) -> str:
    items = [{"metadata": {"name": n, "namespace": "default", "resourceVersion": version}} for n in names]
    meta = {"resourceVersion": version, "continue": token}
    body = {"kind": "ResourceClaimList", "apiVersion": "resource.k8s.io/v1", "metadata": meta, "items": items}
    return json.dumps(body)


async def _serve(expiries: int, seen: list[str]) -> tuple[web.AppRunner, str]:
    left = [expiries]

    async def listing(request: web.Request) -> web.Response:
        token = request.query.get("continue", "")
        seen.append(token or "first")
        if not token:
            version = str(7 + len([s for s in seen if s == "first"]))  # a new snapshot per list
            return web.Response(text=_page(["a", "b"], version, f"next@{version}"), content_type="application/json")
        if left[0] > 0:
            left[0] -= 1
            return web.Response(status=410, text=json.dumps(EXPIRED), content_type="application/json")
        return web.Response(text=_page(["c"], token.split("@")[1], ""), content_type="application/json")

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceclaims", listing)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _watch_once(expiries: int, seen: list[str]) -> list[Any]:
    """kopf's continuous_watch up to the end of its listing (paused at once: no watch request)."""
    runner, server = await _serve(expiries, seen)
    vault = credentials.Vault()
    await vault.populate({"test": credentials.ConnectionInfo(server=server)})
    auth.vault_var.set(vault)
    settings = configuration.OperatorSettings()
    settings.watching.chunk_size = 2
    paused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    paused.set_result(None)
    out: list[Any] = []
    try:
        async for event in watching.continuous_watch(
            settings=settings, resource=RESOURCE, namespace=None, operator_pause_waiter=paused
        ):
            out.append("LISTED" if event is watching.Bookmark.LISTED else event["object"]["metadata"]["name"])
    finally:
        await runner.cleanup()
    return out


@pytest.fixture
def released_kopf() -> Iterator[None]:
    kopf_listing.uninstall()
    yield
    kopf_listing.uninstall()


@pytest.mark.usefixtures("released_kopf")
def test_kopf_alone_stops_on_an_expired_continue_token() -> None:
    seen: list[str] = []
    with pytest.raises(errors.APIError) as err:
        asyncio.run(_watch_once(1, seen))
    assert err.value.status == 410
    assert seen == ["first", "next@8"]


@pytest.mark.usefixtures("released_kopf")
def test_an_expired_token_lists_again_from_a_new_snapshot() -> None:
    kopf_listing.install()
    kopf_listing.install()  # idempotent: one wrapper, not two
    seen: list[str] = []
    events = asyncio.run(_watch_once(2, seen))
    assert events == ["a", "b", "a", "b", "a", "b", "c", "LISTED"]
    assert seen == ["first", "next@8", "first", "next@9", "first", "next@10"]


@pytest.mark.usefixtures("released_kopf")
def test_a_list_that_keeps_expiring_says_what_to_do() -> None:
    kopf_listing.install()
    seen: list[str] = []
    with pytest.raises(kopf_listing.ListingFellBehind, match="more CPU") as err:
        asyncio.run(_watch_once(kopf_listing.MAX_RESTARTS + 1, seen))
    assert kopf_listing.expired(err.value.__cause__ or err.value)
    assert seen.count("first") == kopf_listing.MAX_RESTARTS + 1


@pytest.mark.usefixtures("released_kopf")
def test_other_list_errors_are_not_retried() -> None:
    kopf_listing.install()

    async def forbidden(**_: Any) -> Any:
        raise errors.APIForbiddenError({"code": 403, "message": "no"}, status=403, headers={})
        yield  # an async generator, like kopf's

    wrapped = kopf_listing._restarting(forbidden)

    async def drain() -> None:
        async for _ in wrapped(resource=RESOURCE):
            pass

    with pytest.raises(errors.APIForbiddenError):
        asyncio.run(drain())


def test_slices_are_listed_in_small_pages_and_kopfs_settings_are_left_as_they_were() -> None:
    settings = configuration.OperatorSettings()
    settings.watching.chunk_size = 100
    asked: dict[str, int | None] = {}

    async def fake_fetch(**kw: Any) -> Any:
        asked[kw["resource"].plural] = kw["settings"].watching.chunk_size
        yield [], "1"

    slices = references.Resource(group="resource.k8s.io", version="v1", plural="resourceslices")

    async def run() -> None:
        fetch = kopf_listing._restarting(fake_fetch)
        for resource in (slices, RESOURCE):
            async for _ in fetch(settings=settings, resource=resource, namespace=None, logger=None):
                pass

    asyncio.run(run())
    assert asked == {"resourceslices": kopf_listing.SLICE_PAGE, "resourceclaims": 100}
    assert settings.watching.chunk_size == 100  # the operator's own settings: unchanged
    settings.watching.chunk_size = 5
    assert kopf_listing.paged(settings, kopf_listing.SLICE_PAGE) is settings  # already small enough
