"""Informers: one resource listed and watched into indexes, in the shape of client-go's shared informers.

A :class:`Stream` names a resource (its path, selectors, page size), a transform applied to each
object as it is decoded (keep only what the reader needs: client-go's ``TransformFunc``), and its
indexers. An :class:`Informer` keeps the stream's indexes current:

* a **paged list** (``limit``/``continue``); a continue token that expired (410, the API server
  compacted past the list's snapshot) starts the list again without it, up to :data:`MAX_RESTARTS`
  times in a row (:class:`ListingFellBehind` then says what to do);
* a **watch** from the list's resourceVersion, with bookmarks, **resumed** from the last version seen
  whenever the stream ends or the connection fails (with backoff), and a **re-list** only on 410;
* after a re-list, every object the list no longer has is removed (a ``DELETED`` event);
* **indexes**: each indexer maps an object to ``{index key: value}`` (``{}``: not indexed), and
  :class:`Index` keeps, per index key, the values of the objects that gave one, like kopf's and
  client-go's indexers. No object body is kept: only what the indexers return;
* **synced**: set once the first list is applied, so nothing decides on half-built indexes;
* **handlers**, called after the indexes took an event: cheap and synchronous (they enqueue work on a
  :class:`gpuplane.informer.workqueue.WorkQueue` or wake a loop), so a slow reconcile never stalls a watch.

Events are applied in the event loop's one thread; a reader that copies an index without awaiting in
between sees one consistent instant.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpuplane.informer.client import ApiError, Client

log = structlog.get_logger(__name__)

MAX_RESTARTS = 10  # consecutive expiries of one list before the process gives up (~50 min at 5-min compaction)
WATCH_TIMEOUT_S = 300  # the API server ends each watch request after this (kopf and client-go use 5-10 min)
BACKOFF_S = (0.5, 30.0)  # a failed list or watch is retried after this, doubling up to the maximum
NOT_SERVED_RECHECK_S = 60.0  # a resource the API server does not serve (404: its CRD not installed) is listed again

Indexer = Callable[[Mapping[str, Any]], Mapping[str, Any]]  # object -> {index key: value}; {} = not indexed
Transform = Callable[[dict[str, Any]], dict[str, Any]]  # a decoded object -> what the informer hands on


class ListingFellBehind(RuntimeError):
    """The same list expired :data:`MAX_RESTARTS` times in a row: this process cannot keep up with it."""


def _same(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


@dataclass(frozen=True)
class Stream:
    """One resource to list and watch."""

    name: str  # for logs and metrics ("slices")
    path: str  # the collection's path: /api/v1/pods, /apis/resource.k8s.io/v1/resourceslices
    kind: str  # the objects' kind (list items do not say it)
    indexers: Mapping[str, Indexer]
    page: int = 100  # objects per listed page
    field_selector: str = ""
    label_selector: str = ""
    transform: Transform = _same

    def params(self) -> dict[str, str]:
        """The selectors as query parameters."""
        out: dict[str, str] = {}
        if self.field_selector:
            out["fieldSelector"] = self.field_selector
        if self.label_selector:
            out["labelSelector"] = self.label_selector
        return out


@dataclass(frozen=True)
class Event:
    """What a handler is told: after the indexes took it."""

    type: str  # ADDED | MODIFIED | DELETED
    key: str  # namespace/name, or name for a cluster-scoped object
    obj: Mapping[str, Any]  # the transformed object (of a DELETED one found by a re-list: its metadata only)
    entries: tuple[tuple[str, str], ...] = ()  # (index, key) pairs the object had before this event


Handler = Callable[[Event], None]


def key_of(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object ("" when it has no name)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str):
        return ""
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


class Index(Mapping[str, ValuesView[Any]]):
    """Index key -> the values of the objects indexed under it (read-only to everyone but its informer)."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, Any]] = {}

    def __getitem__(self, key: str) -> ValuesView[Any]:
        return self._data[key].values()

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def put(self, key: str, obj_key: str, value: Any) -> None:
        """``obj_key``'s value under ``key``."""
        self._data.setdefault(key, {})[obj_key] = value

    def drop(self, key: str, obj_key: str) -> None:
        """``obj_key``'s value under ``key`` gone."""
        values = self._data.get(key)
        if values is not None:
            values.pop(obj_key, None)
            if not values:
                del self._data[key]


@dataclass
class Counters:
    """What an informer did (read by the controller's metrics and by tests)."""

    lists: int = 0
    list_restarts: int = 0
    watches: int = 0
    events: int = 0
    failures: int = 0


class Informer:
    """One stream's list-and-watch loop and its indexes."""

    def __init__(self, client: Client | None, stream: Stream, handlers: Sequence[Handler] = ()) -> None:
        self.client, self.stream = client, stream
        self.handlers: list[Handler] = list(handlers)
        self.indexes: dict[str, Index] = {name: Index() for name in stream.indexers}
        self.synced = asyncio.Event()
        self.counters = Counters()
        self.version = ""  # the last resourceVersion seen
        self._entries: dict[str, tuple[tuple[str, str], ...]] = {}  # object key -> its (index, key) pairs

    def size(self) -> int:
        """Objects held in the indexes."""
        return len(self._entries)

    # --- applying objects (no I/O: tests drive these directly) ------------------------------------
    def apply(self, type_: str, obj: dict[str, Any]) -> None:
        """One object's event: indexes updated, then every handler told."""
        key = key_of(obj)
        if not key:
            return
        before = self._entries.get(key, ())
        entries: list[tuple[str, str]] = []
        if type_ != "DELETED":
            for index, indexer in self.stream.indexers.items():
                try:
                    got = indexer(obj)
                except Exception:  # an indexer's bug must not end the watch; the object is not indexed
                    log.exception("indexer failed; object left out of the index", index=index, object=key)
                    got = {}
                for ikey, value in got.items():
                    self.indexes[index].put(ikey, key, value)
                    entries.append((index, ikey))
        kept = frozenset(entries)
        for index, ikey in before:
            if (index, ikey) not in kept:
                self.indexes[index].drop(ikey, key)
        if entries:
            self._entries[key] = tuple(entries)
        else:
            self._entries.pop(key, None)
        event = Event(type_, key, obj, before)
        for handler in self.handlers:
            try:
                handler(event)
            except Exception:  # one handler's bug must not stop the others or the watch
                log.exception("informer handler failed", stream=self.stream.name, object=key)

    def vanished(self, seen: set[str]) -> None:
        """After a complete re-list: every indexed object the list did not have is deleted."""
        for key in [k for k in self._entries if k not in seen]:
            namespace, _, name = key.rpartition("/")
            meta = {"name": name, **({"namespace": namespace} if namespace else {})}
            self.apply("DELETED", {"metadata": meta})

    def _decoded(self, obj: Any) -> dict[str, Any] | None:
        if not isinstance(obj, dict):
            return None
        obj.setdefault("kind", self.stream.kind)
        return self.stream.transform(obj)

    # --- I/O ----------------------------------------------------------------------------------------
    async def list_all(self) -> None:
        """A complete paged list applied (restarted on an expired continue token), then what it lacked removed."""
        assert self.client is not None
        s = self.stream
        restarts = 0
        while True:
            seen: set[str] = set()
            token, pages = "", 0
            try:
                while True:
                    params = {**s.params(), "limit": str(s.page)}
                    if token:
                        params["continue"] = token
                    page = await self.client.list(s.path, params)
                    pages += 1
                    meta = page.get("metadata") or {}
                    for item in page["items"]:
                        obj = self._decoded(item)
                        if obj is not None:
                            seen.add(key_of(obj))
                            self.apply("ADDED", obj)
                    del page
                    token = str(meta.get("continue") or "")
                    if not token:
                        self.version = str(meta.get("resourceVersion") or "")
                        break
                    await asyncio.sleep(0)  # let the other streams and the handlers' loops run between pages
            except ApiError as err:
                if not err.gone or pages == 0:
                    raise
                restarts += 1
                self.counters.list_restarts += 1
                if restarts > MAX_RESTARTS:
                    raise ListingFellBehind(
                        f"listing {s.name} expired {MAX_RESTARTS} times in a row: each list took longer than the "
                        "API server keeps a snapshot (etcd compaction). Give the controller more CPU, or raise "
                        "kube-apiserver's --etcd-compaction-interval; the next replica starts over."
                    ) from err
                log.warning(
                    "listing fell behind the API server's compaction; listing again from a new snapshot",
                    stream=s.name,
                    pages_read=pages,
                    restart=restarts,
                )
                continue
            self.counters.lists += 1
            self.vanished(seen)
            return

    async def watch_once(self) -> None:
        """One watch request from :attr:`version`, applied until the server ends it; raises ApiError(410) when
        the version is too old."""
        assert self.client is not None
        s = self.stream
        self.counters.watches += 1
        params = {**s.params(), "resourceVersion": self.version}
        async for event in self.client.watch(s.path, params, WATCH_TIMEOUT_S):
            if not isinstance(event, Mapping):
                continue
            type_, obj = event.get("type"), event.get("object")
            if type_ == "ERROR":
                status = obj if isinstance(obj, Mapping) else {}
                raise ApiError(int(status.get("code") or 500), str(status.get("reason") or ""), str(status))
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
            if type_ in ("ADDED", "MODIFIED", "DELETED"):
                decoded = self._decoded(obj)
                if decoded is not None:
                    self.counters.events += 1
                    self.apply(str(type_), decoded)
            if isinstance(version, str) and version:  # BOOKMARK carries only this
                self.version = version

    async def run(self) -> None:
        """Forever: list, watch and resume; re-list on 410; back off on failures."""
        listed = False
        delay = BACKOFF_S[0]
        while True:
            try:
                if not listed:
                    await self.list_all()
                    listed = True
                    self.synced.set()
                    log.info("informer synced", stream=self.stream.name, objects=len(self._entries))
                await self.watch_once()
                delay = BACKOFF_S[0]
            except ListingFellBehind:
                raise
            except ApiError as err:
                if err.gone and listed:
                    log.info("watch too old; listing again", stream=self.stream.name)
                    listed = False
                    continue
                if err.status == 404 and listed:  # the resource went away (its CRD deleted): list to find out
                    listed = False
                    continue
                if err.status == 404:  # not served (an optional CRD): empty, and looked for again
                    if not self.synced.is_set():
                        log.info("resource not served; treated as empty", stream=self.stream.name)
                    self.vanished(set())
                    self.synced.set()
                    await asyncio.sleep(NOT_SERVED_RECHECK_S)
                    continue
                delay = await self._backoff(err, delay)
            except Exception as err:  # connection lost, a timeout, an undecodable line: resume from the version
                delay = await self._backoff(err, delay)

    async def _backoff(self, err: BaseException, delay: float) -> float:
        self.counters.failures += 1
        log.warning("list or watch failed; retrying", stream=self.stream.name, error=str(err)[:300], in_s=delay)
        await asyncio.sleep(delay * (0.5 + random.random() / 2))
        return min(delay * 2, BACKOFF_S[1])


@dataclass
class Caches:
    """Every informer of a process: their indexes by name, one synced signal, one task to run them all."""

    informers: Sequence[Informer]
    indexes: dict[str, Index] = field(init=False)

    def __post_init__(self) -> None:
        self.indexes = {}
        for informer in self.informers:
            for name, index in informer.indexes.items():
                if name in self.indexes:
                    raise ValueError(f"index {name!r} declared twice")
                self.indexes[name] = index

    def synced(self) -> bool:
        """Whether every informer has applied its first complete list."""
        return all(i.synced.is_set() for i in self.informers)

    async def wait_synced(self) -> None:
        """Until :meth:`synced`."""
        for informer in self.informers:
            await informer.synced.wait()

    def informer(self, name: str) -> Informer:
        """The informer of stream ``name``."""
        return next(i for i in self.informers if i.stream.name == name)

    async def run(self) -> None:
        """Every informer, until one fails for good (then that error; the others are cancelled)."""
        async with asyncio.TaskGroup() as group:
            for informer in self.informers:
                group.create_task(informer.run(), name=f"informer {informer.stream.name}")
