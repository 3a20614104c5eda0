"""kopf's own list and watch code, against a real HTTP server, decodes through the bounded decoder.

The server serves a ResourceClaim list and a watch stream, each with one claim
nested 3,000 levels deep between two ordinary ones. Without
:func:`gpuplane.controller.kopf_decoding.install` kopf raises ``RecursionError`` on both
(asserted first, so a kopf that stopped recursing would show up here); with it,
the deep claim arrives as a quarantined stub and its neighbours intact.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import auth, fetching
from kopf._cogs.configs import configuration
from kopf._cogs.structs import credentials, references

from gpuplane.api import boundedjson
from gpuplane.controller import kopf_decoding
from tests.hostile import claim_text, wrap
from tests.kopfkit import pristine_kopf  # noqa: F401 - the fixture

SHAPES = ((5, "a"), (3000, "deep"), (5, "c"))
LIST = wrap(
    '{"kind":"ResourceClaimList","apiVersion":"resource.k8s.io/v1","metadata":{"resourceVersion":"7"},"items":[',
    ",".join(claim_text(levels, name) for levels, name in SHAPES),
    "]}",
)
EVENTS = "".join(wrap('{"type":"ADDED","object":', claim_text(lv, nm), "}\n") for lv, nm in SHAPES)
RESOURCE = references.Resource(group="resource.k8s.io", version="v1", plural="resourceclaims", namespaced=True)


async def _serve() -> tuple[web.AppRunner, str]:
    async def listing(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(EVENTS.encode())
            await response.write_eof()
            return response
        return web.Response(text=LIST, content_type="application/json")

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceclaims", listing)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def _with_kopf(body: Callable[[configuration.OperatorSettings], Any]) -> Any:
    runner, server = await _serve()
    vault = credentials.Vault()
    await vault.populate({"test": credentials.ConnectionInfo(server=server)})
    auth.vault_var.set(vault)
    try:
        return await body(configuration.OperatorSettings())
    finally:
        await runner.cleanup()


async def _list(settings: configuration.OperatorSettings) -> list[Any]:
    out: list[Any] = []
    async for chunk, _version in fetching.fetch_objs(
        settings=settings, resource=RESOURCE, namespace=None, logger=logging.getLogger("t")
    ):
        out.extend(chunk)
    return out


async def _watch(settings: configuration.OperatorSettings) -> list[Any]:
    url = RESOURCE.get_url(namespace=None, params={"watch": "true"})
    stream: AsyncIterator[Any] = kopf_api.stream(url=url, settings=settings, logger=logging.getLogger("t"))
    return [event async for event in stream]


@pytest.mark.usefixtures("pristine_kopf")
def test_kopf_alone_crashes_on_a_deep_claim() -> None:
    assert kopf_decoding.installed() is None
    with pytest.raises(RecursionError):
        asyncio.run(_with_kopf(_list))
    with pytest.raises(RecursionError):
        asyncio.run(_with_kopf(_watch))


@pytest.mark.usefixtures("pristine_kopf")
def test_installed_kopf_lists_the_deep_claim_as_a_stub() -> None:
    kopf_decoding.install()
    assert kopf_decoding.installed() == boundedjson.MAX_OBJECT_DEPTH
    items = asyncio.run(_with_kopf(_list))
    assert [i["metadata"]["name"] for i in items] == ["a", "deep", "c"]
    assert [boundedjson.rejection(i) is not None for i in items] == [False, True, False]
    assert items[0]["spec"]["devices"]["config"][0]["opaque"]["driver"] == "gpu.gpuplane.dev"
    assert items[1]["kind"] == "ResourceClaim"  # kopf fills kind/apiVersion from the list as usual


@pytest.mark.usefixtures("pristine_kopf")
def test_installed_kopf_watches_past_the_deep_claim() -> None:
    kopf_decoding.install()
    events = asyncio.run(_with_kopf(_watch))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "deep"),
        ("ADDED", "c"),
    ]
    reason = boundedjson.rejection(events[1]["object"])
    assert reason is not None and "spec.devices.config[0].opaque.parameters" in reason


@pytest.mark.usefixtures("pristine_kopf")
def test_install_is_idempotent() -> None:
    kopf_decoding.install()
    first = kopf_api.get
    kopf_decoding.install()
    assert kopf_api.get is first


@pytest.mark.usefixtures("pristine_kopf")
def test_an_empty_body_reads_as_none() -> None:
    kopf_decoding.install()

    async def empty(_settings: configuration.OperatorSettings) -> Any:
        async def handler(_request: web.Request) -> web.Response:
            return web.Response(body=b"", content_type="application/json")

        app = web.Application()
        app.router.add_delete("/x", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/x"
            return await kopf_api.delete(url, settings=_settings, logger=logging.getLogger("t"))
        finally:
            await runner.cleanup()

    assert asyncio.run(_with_kopf(empty)) is None
