"""gpuplane.informer: Informer and Client against a real local HTTP server, plus Informer.apply and Caches."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuplane.api import boundedjson
from gpuplane.informer import cache
from gpuplane.informer.cache import Caches, Event, Handler, Informer, ListingFellBehind, Stream, key_of
from gpuplane.informer.client import Client, Endpoint

PATH = "/apis/example.dev/v1/things"
END = b""  # fed to a watch: the server ends that stream
P = ParamSpec("P")
Reply = tuple[int, Any]  # a list answer: status and JSON body


def thing(name: str, node: str, rv: str = "1", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "spec": {"node": node, **spec}}


def line(type_: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": type_, "object": obj}).encode()


def status(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "code": code, "reason": reason, "message": message}


EXPIRED = status(410, "Expired", "The provided continue parameter is too old")


def page(items: list[dict[str, Any]], rv: str = "100", cont: str = "") -> Reply:
    return 200, {"kind": "ThingList", "metadata": {"resourceVersion": rv, "continue": cont}, "items": items}


def by_node(obj: Mapping[str, Any]) -> dict[str, Any]:
    if boundedjson.rejection(obj):
        return {}
    node = obj.get("spec", {}).get("node")
    return {node: obj["metadata"]["name"]} if isinstance(node, str) else {}


def by_rejection(obj: Mapping[str, Any]) -> dict[str, Any]:
    reason = boundedjson.rejection(obj)
    return {key_of(obj): reason} if reason else {}


INDEXERS = {"node": by_node, "rejected": by_rejection}
STREAM = Stream(name="things", path=PATH, kind="Thing", indexers=INDEXERS, page=2, label_selector="app=x")


def names(informer: Informer, node: str) -> list[str]:
    index = informer.indexes["node"]
    return sorted(index[node]) if node in index else []


@dataclass
class Request:
    watch: bool
    query: dict[str, str]
    authorization: str | None


class FakeApi:
    """The collection at PATH: a list is answered by ``on_list``; a watch streams what the test puts in ``feed``."""

    def __init__(self, on_list: Callable[[dict[str, str]], Reply]) -> None:
        self.on_list = on_list
        self.requests: list[Request] = []
        self.token: str | None = "Bearer t"  # what the client's authorization callable returns now
        self.feed: asyncio.Queue[bytes | Reply] = asyncio.Queue()  # a line, END, or an HTTP error (status, body)

    def lists(self) -> list[dict[str, str]]:
        return [r.query for r in self.requests if not r.watch]

    def watches(self) -> list[dict[str, str]]:
        return [r.query for r in self.requests if r.watch]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        watch = query.get("watch") == "true"
        self.requests.append(Request(watch, query, request.headers.get("Authorization")))
        if not watch:
            code, body = self.on_list(query)
            return web.json_response(body, status=code)
        item = await self.feed.get()  # (the server cancels this handler when the client goes away)
        if isinstance(item, tuple):  # an error status instead of a stream
            return web.json_response(item[1], status=item[0])
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        while item != END:
            await response.write(item + b"\n")
            item = await self.feed.get()
        return response


@contextlib.asynccontextmanager
async def running(api: FakeApi, handlers: Sequence[Handler] = ()) -> AsyncIterator[tuple[Informer, asyncio.Task[None]]]:
    """A server for ``api`` on 127.0.0.1, and an informer's ``run()`` against it; both stopped on the way out."""
    app = web.Application()
    app.router.add_get(PATH, api.handle)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    client = Client(Endpoint(host=f"http://127.0.0.1:{server.port}", ssl=False, authorization=lambda: api.token))
    informer = Informer(client, STREAM, handlers)
    task = asyncio.create_task(informer.run())
    try:
        yield informer, task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await client.close()
        await server.close()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.002)


def synchronous(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """An async test run in its own event loop (no pytest-asyncio here)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@synchronous
async def test_paged_list_sends_limit_and_continue_and_indexes_every_page() -> None:
    """A list of three pages sends limit, selectors and each continue token, indexes all, syncs, keeps its version."""
    objs = [thing(f"t{i}", f"n{i % 2}") for i in range(5)]

    def on_list(q: dict[str, str]) -> Reply:
        start = int(q.get("continue") or 0)
        end = start + int(q["limit"])
        return page(objs[start:end], rv="100", cont=str(end) if end < len(objs) else "")

    api = FakeApi(on_list)
    async with running(api) as (informer, _):
        await asyncio.wait_for(informer.synced.wait(), 10)
        assert [q.get("continue") for q in api.lists()] == [None, "2", "4"]
        assert all(q["limit"] == "2" and q["labelSelector"] == "app=x" for q in api.lists())
        assert names(informer, "n0") == ["t0", "t2", "t4"] and names(informer, "n1") == ["t1", "t3"]
        assert informer.version == "100" and informer.counters.lists == 1


@synchronous
async def test_expired_continue_token_restarts_the_list_from_the_start() -> None:
    """A 410 on page two restarts the list without continue; what only the first try had is deleted."""
    calls: list[str | None] = []

    def on_list(q: dict[str, str]) -> Reply:
        calls.append(q.get("continue"))
        first = page([thing("stale", "n1"), thing("a", "n1")], cont="c1")
        replies = [first, (410, EXPIRED), page([thing("a", "n1")], cont="c2"), page([thing("b", "n2")], rv="200")]
        return replies[len(calls) - 1]

    events: list[Event] = []
    async with running(FakeApi(on_list), handlers=[events.append]) as (informer, _):
        await asyncio.wait_for(informer.synced.wait(), 10)
        assert calls == [None, "c1", None, "c2"]
        assert informer.counters.list_restarts == 1 and informer.counters.lists == 1
        assert names(informer, "n1") == ["a"] and names(informer, "n2") == ["b"] and informer.version == "200"
        assert [e.key for e in events if e.type == "DELETED"] == ["ns/stale"]


@synchronous
async def test_list_expiring_more_than_max_restarts_raises_listing_fell_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list whose continue token expires MAX_RESTARTS + 1 times in a row ends run() with ListingFellBehind."""
    monkeypatch.setattr(cache, "MAX_RESTARTS", 2)
    api = FakeApi(lambda q: (410, EXPIRED) if "continue" in q else page([thing("a", "n1")], cont="c"))
    async with running(api) as (informer, task):
        with pytest.raises(ListingFellBehind, match="expired 2 times"):
            await asyncio.wait_for(task, 10)
        assert informer.counters.list_restarts == 3 and len(api.lists()) == 6
        assert not informer.synced.is_set() and not api.watches()


@synchronous
async def test_watch_applies_events_bookmarks_and_resumes_from_the_last_version() -> None:
    """The watch starts at the list's version, applies events in order, takes bookmarks, resumes at the last one."""
    events: list[Event] = []
    api = FakeApi(lambda q: page([thing("a", "n1", "10")], rv="10"))
    async with running(api, handlers=[events.append]) as (informer, _):
        await until(lambda: len(api.watches()) == 1)
        first = api.watches()[0]
        assert (first["resourceVersion"], first["watch"], first["allowWatchBookmarks"]) == ("10", "true", "true")
        bookmark = {"kind": "Thing", "metadata": {"resourceVersion": "14"}}
        for type_, obj in [("ADDED", thing("b", "n1", "11")), ("MODIFIED", thing("a", "n2", "12"))]:
            api.feed.put_nowait(line(type_, obj))
        api.feed.put_nowait(line("DELETED", thing("b", "n1", "13")))
        api.feed.put_nowait(line("BOOKMARK", bookmark))
        await until(lambda: informer.version == "14")
        was_n1 = (("node", "n1"),)  # the entries before the event
        got = [(e.type, e.key, e.entries) for e in events]
        assert got[:2] == [("ADDED", "ns/a", ()), ("ADDED", "ns/b", ())]
        assert got[2:] == [("MODIFIED", "ns/a", was_n1), ("DELETED", "ns/b", was_n1)]
        assert "n1" not in informer.indexes["node"] and names(informer, "n2") == ["a"]
        assert informer.counters.events == 3 and events[1].obj["kind"] == "Thing"
        api.feed.put_nowait(END)
        await until(lambda: len(api.watches()) == 2)
        assert api.watches()[1]["resourceVersion"] == "14"
        assert informer.counters.lists == 1 and informer.counters.failures == 0 and len(events) == 4


@synchronous
async def test_failed_watch_is_retried_from_the_same_version_without_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch answered 500 is retried after a backoff from the same version, with no re-list."""
    monkeypatch.setattr(cache, "BACKOFF_S", (0.001, 0.01))
    api = FakeApi(lambda q: page([thing("a", "n1", "10")], rv="10"))
    async with running(api) as (informer, _):
        await until(lambda: len(api.watches()) == 1)
        api.feed.put_nowait((500, status(500, "InternalError", "etcd is sad")))
        await until(lambda: len(api.watches()) == 2)
        assert api.watches()[1]["resourceVersion"] == "10"
        assert informer.counters.failures == 1 and len(api.lists()) == 1


@pytest.mark.parametrize("how", ["error event", "http 410"])
@synchronous
async def test_watch_gone_lists_again_and_deletes_what_vanished(how: str) -> None:
    """A 410 on the watch (ERROR event or HTTP status) re-lists; objects the new list lacks get a DELETED event."""
    lists = [page([thing("a", "n1", "5"), thing("b", "n1", "6")], rv="10"), page([thing("a", "n2", "15")], rv="20")]
    events: list[Event] = []
    api = FakeApi(lambda q: lists[min(len(api.lists()), 2) - 1])
    async with running(api, handlers=[events.append]) as (informer, _):
        await until(lambda: len(api.watches()) == 1)
        gone = status(410, "Expired", "too old resource version: 10 (15)")
        api.feed.put_nowait(line("ERROR", gone) if how == "error event" else (410, gone))
        await until(lambda: len(api.watches()) == 2)
        assert informer.counters.lists == 2 and api.watches()[1]["resourceVersion"] == "20"
        deleted = [(e.key, e.entries, e.obj) for e in events if e.type == "DELETED"]
        assert deleted == [("ns/b", (("node", "n1"),), {"metadata": {"name": "b", "namespace": "ns"}})]
        assert "n1" not in informer.indexes["node"] and names(informer, "n2") == ["a"] and informer.synced.is_set()


@synchronous
async def test_resource_not_served_is_synced_empty_and_listed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 404 on the list syncs with empty indexes; the list is retried and picked up once the resource is served."""
    monkeypatch.setattr(cache, "NOT_SERVED_RECHECK_S", 0.01)
    served = [False]

    def on_list(q: dict[str, str]) -> Reply:
        if served[0]:
            return page([thing("a", "n1", "7")], rv="7")
        return 404, status(404, "NotFound", "the server could not find the requested resource")

    api = FakeApi(on_list)
    async with running(api) as (informer, _):
        await asyncio.wait_for(informer.synced.wait(), 10)
        assert all(len(index) == 0 for index in informer.indexes.values())
        await until(lambda: len(api.lists()) >= 3)
        assert not api.watches() and informer.counters.failures == 0
        served[0] = True
        await until(lambda: len(api.watches()) == 1)
        assert names(informer, "n1") == ["a"] and api.watches()[0]["resourceVersion"] == "7"


@synchronous
async def test_too_deep_objects_arrive_quarantined_and_later_events_still_apply() -> None:
    """Objects nested deeper than MAX_OBJECT_DEPTH (in a page and a watch line) are quarantined, not fatal."""
    shallow = boundedjson.MAX_OBJECT_DEPTH + 6
    nested = functools.reduce(lambda inner, _: [inner], range(shallow), [])
    deep = 5000  # deeper than json's own recursion limit
    deep_line = line("ADDED", thing("deep", "n1", "11", nested="HOLE")).replace(b'"HOLE"', b"[" * deep + b"]" * deep)
    events: list[Event] = []
    api = FakeApi(lambda q: page([thing("listed", "n1", "9", nested=nested), thing("ok", "n3")], rv="10"))
    async with running(api, handlers=[events.append]) as (informer, _):
        await until(lambda: len(api.watches()) == 1)
        api.feed.put_nowait(deep_line)
        api.feed.put_nowait(line("ADDED", thing("after", "n2", "12")))
        await until(lambda: informer.version == "12")
        rejected = informer.indexes["rejected"]
        assert sorted(rejected) == ["ns/deep", "ns/listed"]
        assert all("deeper than" in next(iter(rejected[k])) for k in rejected)
        assert names(informer, "n2") == ["after"] and names(informer, "n3") == ["ok"]
        assert "n1" not in informer.indexes["node"]
        quarantined = next(e.obj for e in events if e.key == "ns/deep")
        assert boundedjson.rejection(quarantined) and quarantined["metadata"]["resourceVersion"] == "11"
        assert informer.counters.failures == 0


@synchronous
async def test_watch_line_larger_than_aiohttp_line_limit_is_applied() -> None:
    """A 1 MB watch event (past aiohttp's readline limit, 512 KiB in aiohttp 3.14) is applied, and the next one too."""
    big = thing("big", "n1", "11")
    big["metadata"]["annotations"] = {"note": "x" * 1_000_000}
    events: list[Event] = []
    api = FakeApi(lambda q: page([], rv="10"))
    async with running(api, handlers=[events.append]) as (informer, _):
        await until(lambda: len(api.watches()) == 1)
        api.feed.put_nowait(line("ADDED", big))
        api.feed.put_nowait(line("ADDED", thing("small", "n2", "12")))
        await until(lambda: informer.version == "12")
        objs = {e.key: e.obj for e in events}
        assert objs["ns/big"]["metadata"]["annotations"]["note"] == "x" * 1_000_000
        assert names(informer, "n1") == ["big"] and names(informer, "n2") == ["small"]
        assert informer.counters.failures == 0


@synchronous
async def test_authorization_is_asked_for_on_every_request() -> None:
    """Each list page and watch request carries the Authorization value the callable returns at that moment."""

    def on_list(q: dict[str, str]) -> Reply:
        api.token = f"Bearer {len(api.requests) + 1}"  # rotated after every page
        return page([thing("a", "n1")], cont="c") if "continue" not in q else page([thing("b", "n1")], rv="9")

    api = FakeApi(on_list)
    api.token = "Bearer 1"
    async with running(api):
        await until(lambda: len(api.watches()) == 1)
        api.token = "Bearer 4"
        api.feed.put_nowait(END)
        await until(lambda: len(api.watches()) == 2)
        api.token = None
        api.feed.put_nowait(END)
        await until(lambda: len(api.watches()) == 3)
        assert [r.authorization for r in api.requests] == ["Bearer 1", "Bearer 2", "Bearer 3", "Bearer 4", None]


def test_apply_moves_an_object_between_index_keys() -> None:
    """When an indexer's key for an object changes, the object leaves the old key and joins the new one."""
    events: list[Event] = []
    informer = Informer(None, STREAM, [events.append])
    informer.apply("ADDED", thing("a", "n1"))
    informer.apply("ADDED", thing("b", "n1"))
    informer.apply("MODIFIED", thing("a", "n2"))
    assert names(informer, "n1") == ["b"] and names(informer, "n2") == ["a"]
    assert events[-1].entries == (("node", "n1"),)
    informer.apply("DELETED", thing("b", "n1"))
    assert list(informer.indexes["node"]) == ["n2"]
    informer.apply("ADDED", {"metadata": {}})  # no name: no key, ignored
    assert [e.type for e in events] == ["ADDED", "ADDED", "MODIFIED", "DELETED"]


def test_raising_indexer_or_handler_does_not_stop_the_others() -> None:
    """A raising indexer leaves the object out of its index only; a raising handler does not stop the next one."""

    def fussy(obj: Mapping[str, Any]) -> dict[str, Any]:
        if obj["spec"]["node"] == "bad":
            raise ValueError("boom")
        return {"all": key_of(obj)}

    def broken(event: Event) -> None:
        raise RuntimeError("handler bug")

    events: list[Event] = []
    stream = Stream("s", PATH, "Thing", {"fussy": fussy, "node": by_node})
    informer = Informer(None, stream, [broken, events.append])
    informer.apply("ADDED", thing("a", "good"))
    assert list(informer.indexes["fussy"]["all"]) == ["ns/a"]
    informer.apply("MODIFIED", thing("a", "bad"))
    assert "all" not in informer.indexes["fussy"] and names(informer, "bad") == ["a"]
    assert [(e.type, e.entries) for e in events] == [("ADDED", ()), ("MODIFIED", (("fussy", "all"), ("node", "good")))]


@synchronous
async def test_caches_are_synced_only_when_every_informer_is() -> None:
    """Caches.synced()/wait_synced() wait for every informer; indexes are the informers' own, each name once."""
    first = Informer(None, Stream("a", PATH, "Thing", {"x": by_node}))
    second = Informer(None, Stream("b", PATH, "Thing", {"y": by_node}))
    caches = Caches([first, second])
    assert caches.indexes == {"x": first.indexes["x"], "y": second.indexes["y"]}
    assert caches.informer("b") is second
    waiter = asyncio.create_task(caches.wait_synced())
    first.synced.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not caches.synced() and not waiter.done()
    second.synced.set()
    await asyncio.wait_for(waiter, 10)
    assert caches.synced()
    with pytest.raises(ValueError, match="'x' declared twice"):
        Caches([first, Informer(None, Stream("c", PATH, "Thing", {"x": by_node}))])
