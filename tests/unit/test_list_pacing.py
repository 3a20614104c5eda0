"""kopf's paged first listing waits for the handlers (gpuplane.controller.list_pacing), through kopf's own fetch code.

A server serves ResourceSlices in pages (``limit``/``continue``); the consumer stands in for kopf's
per-object queues (it only appends what ``fetch_objs`` yields) and a slow "handler" task takes one
object every few milliseconds and calls ``ListPacer.seen``. With the pacer installed no page is
requested while more than ``bound`` listed objects wait; without it, every page is fetched before
the handler has taken anything (the fleet-scale memory peak).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from typing import Any

import pytest
from aiohttp import web
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import auth, fetching
from kopf._cogs.configs import configuration
from kopf._cogs.structs import credentials, references

from gpuplane.controller import kopf_decoding
from gpuplane.controller.list_pacing import ListPacer

PAGES, PER_PAGE = 5, 4
RESOURCE = references.Resource(group="resource.k8s.io", version="v1", plural="resourceslices", namespaced=False)


def _page(index: int) -> str:
    items = [{"metadata": {"name": f"s-{index}-{i}"}, "spec": {"devices": []}} for i in range(PER_PAGE)]
    more = str(index + 1) if index + 1 < PAGES else ""
    return json.dumps(
        {
            "kind": "ResourceSliceList",
            "apiVersion": "resource.k8s.io/v1",
            "metadata": {"resourceVersion": "9", "continue": more},
            "items": items,
        }
    )


async def _run(pacer: ListPacer | None) -> tuple[list[int], int]:
    """(objects waiting for the handler when each page was requested, objects listed)."""
    waiting_at_request: list[int] = []
    backlog: list[Any] = []
    taken = 0

    async def listing(request: web.Request) -> web.Response:
        waiting_at_request.append(len(backlog) - taken)
        return web.Response(text=_page(int(request.query.get("continue") or 0)), content_type="application/json")

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", listing)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    vault = credentials.Vault()
    await vault.populate({"t": credentials.ConnectionInfo(server=f"http://127.0.0.1:{runner.addresses[0][1]}")})
    auth.vault_var.set(vault)
    settings = configuration.OperatorSettings()
    settings.watching.chunk_size = PER_PAGE
    done = asyncio.Event()

    async def handler() -> None:
        nonlocal taken
        while not (done.is_set() and taken >= len(backlog)):
            if taken < len(backlog):
                await asyncio.sleep(0.01)
                taken += 1
                if pacer is not None:
                    pacer.seen("resourceslices")
            else:
                await asyncio.sleep(0.005)

    worker = asyncio.create_task(handler())
    try:
        async for chunk, _ in fetching.fetch_objs(
            settings=settings, resource=RESOURCE, namespace=None, logger=logging.getLogger("t")
        ):
            backlog.extend(chunk)
        done.set()
        await worker
    finally:
        await runner.cleanup()
    return waiting_at_request, len(backlog)


@pytest.fixture
def fresh_kopf() -> Any:
    def reset() -> None:
        importlib.reload(kopf_api)
        for mark in (kopf_decoding._MARK, kopf_decoding._PACER):
            if hasattr(kopf_api, mark):
                delattr(kopf_api, mark)

    reset()
    yield
    reset()


def test_without_a_pacer_every_page_is_fetched_before_the_handler_takes_one(fresh_kopf: Any) -> None:
    kopf_decoding.install()
    waiting, listed = asyncio.run(_run(None))
    assert listed == PAGES * PER_PAGE
    assert max(waiting) > PER_PAGE  # the backlog grows with the fleet: the memory peak this module removes


def test_a_paced_listing_requests_no_page_while_more_than_bound_objects_wait(fresh_kopf: Any) -> None:
    pacer = ListPacer(bound=PER_PAGE, max_wait_s=5.0)
    kopf_decoding.install(pacer=pacer)
    waiting, listed = asyncio.run(_run(pacer))
    assert listed == PAGES * PER_PAGE and len(waiting) == PAGES
    assert max(waiting) <= PER_PAGE, waiting
    assert pacer.pages_held >= 1 and pacer.pages_timed_out == 0
    assert pacer.waiting("resourceslices") == 0


def test_the_pacer_slows_a_listing_and_never_stops_it() -> None:
    pacer = ListPacer(bound=2, max_wait_s=0.05)
    pacer.listed("resourceslices", 10)  # no handler ever sees them (a skipped or failing handler)
    asyncio.run(pacer.before_page("resourceslices"))
    assert pacer.pages_timed_out == 1
    pacer.listed("deviceclasses", 10)  # not paced: no handler counts them
    asyncio.run(pacer.before_page("deviceclasses"))
    assert pacer.waiting("deviceclasses") == 0 and pacer.pages_held == 1
    for _ in range(20):
        pacer.seen("resourceslices")  # watched objects count too, never below zero
    assert pacer.waiting("resourceslices") == 0


def test_only_paged_list_urls_are_paced() -> None:
    assert ListPacer.plural_of("https://h/apis/resource.k8s.io/v1/resourceslices?limit=50&continue=x") == (
        "resourceslices"
    )
    assert ListPacer.plural_of("https://h/api/v1/pods?limit=50") == "pods"
    assert ListPacer.plural_of("https://h/api/v1/namespaces/a/pods/p") is None
    assert ListPacer.plural_of("https://h/api/v1/pods?watch=true") is None
    with pytest.raises(ValueError):
        ListPacer(bound=0)
