"""The controller's HTTP client: a paged list, a watch stream and one request, decoded with a bound.

The controller's one client stack, on aiohttp (the HTTP library kopf runs on, so no new stack): the
informers' reads are asynchronous, in the event loop beside kopf's (:class:`Client`); the writes use
the same class on a loop of their own (:mod:`gpuplane.informer.blocking`). Credentials come from a
``kubernetes`` client configuration (kubeconfig or service account: :meth:`Endpoint.of`; only its
loader is used), and the bearer token is asked for on every request, so a projected service-account
token that rotates is picked up (the configuration refreshes it in ``get_api_key_with_prefix``).
Every error is an :class:`ApiError` (status, reason, message and the Status's causes).

Every response is decoded by :mod:`gpuplane.api.boundedjson`: an object nested deeper than the bound
arrives quarantined (marked, its deep fields cut), never as a ``RecursionError``. A watch stream is
split into lines here, without aiohttp's line-length limit (a ResourceSlice of 128 devices is one
line of a few hundred kB), up to :data:`MAX_EVENT_BYTES`.
"""

from __future__ import annotations

import json
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from gpuplane.api import boundedjson

MAX_EVENT_BYTES = 32 * 1024 * 1024  # one watch event; the API server stores objects of at most ~1.5 MiB
LIST_TIMEOUT_S = 60.0  # one page
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0  # one write or read of one object
UNREACHABLE = 0  # an ApiError's status when no answer came (connection refused or reset, timed out)

Answer = Literal["object", "list", "none"]
JSON = "application/json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """The API server answered with an error status (or a watch stream carried an ERROR event)."""

    def __init__(self, status: int, reason: str, message: str, causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message, self.causes = status, reason, message, causes

    @property
    def said(self) -> str:
        """The API server's message with its causes (a PodDisruptionBudget's refusal names the budget)."""
        text = self.message or self.reason or str(self.status)
        return f"{text} ({'; '.join(self.causes)})" if self.causes else text

    @property
    def gone(self) -> bool:
        """410: the resourceVersion (or a list's continue token) is older than the API server keeps."""
        return self.status == 410


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is and how to authenticate to it."""

    host: str
    ssl: ssl.SSLContext | bool
    authorization: Callable[[], str | None]  # the Authorization header's value, asked for on every request

    @classmethod
    def of(cls, configuration: Any) -> Endpoint:
        """From a ``kubernetes.client.Configuration`` (kubeconfig or in-cluster service account)."""
        c = configuration
        context: ssl.SSLContext | bool
        if not c.verify_ssl:
            context = False
        else:
            context = ssl.create_default_context(cafile=c.ssl_ca_cert or None)
            if c.cert_file and c.key_file:
                context.load_cert_chain(c.cert_file, c.key_file)

        def authorization() -> str | None:
            value = c.get_api_key_with_prefix("authorization") or c.get_api_key_with_prefix("BearerToken")
            return str(value) if value else None

        return cls(host=str(c.host).rstrip("/"), ssl=context, authorization=authorization)


def _error(status: int, body: bytes) -> ApiError:
    """An error response's Status object (or its text) as an :class:`ApiError`."""
    try:
        st = boundedjson.decode_object(body)
    except boundedjson.DecodeError:
        st = None
    if isinstance(st, Mapping):
        found = boundedjson.mappings(boundedjson.mapping(st.get("details")).get("causes"))
        causes = tuple(str(c.get("message") or "")[:200] for c in found[:10])
        code = st.get("code")
        return ApiError(
            code if isinstance(code, int) and code >= 400 else status,
            str(st.get("reason") or ""),
            str(st.get("message") or "")[:500],
            causes,
        )
    return ApiError(status, "", body[:500].decode("utf-8", "replace"))


@dataclass(frozen=True)
class Resource:
    """One kind of object in the API: its group (``""``: the core group), version and plural."""

    group: str
    version: str
    plural: str

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        """The collection's path (across namespaces when ``namespace`` is None), one object's, or its subresource's."""
        parts = ["/api", self.version] if not self.group else ["/apis", self.group, self.version]
        if namespace is not None:
            parts += ["namespaces", _segment(namespace)]
        parts.append(self.plural)
        if name is not None:
            parts.append(_segment(name))
            if sub:
                parts.append(sub)
        return "/".join(parts)


def _segment(value: str) -> str:
    if not value or value in (".", ".."):
        raise ValueError(f"not a name of an API object: {value!r}")
    return urllib.parse.quote(value, safe="")


class Client:
    """Lists and watches; open it once inside the event loop (:meth:`open`), close it on the way out."""

    def __init__(self, endpoint: Endpoint, max_depth: int = boundedjson.MAX_OBJECT_DEPTH) -> None:
        self.endpoint = endpoint
        self.max_depth = max_depth
        self._session: aiohttp.ClientSession | None = None

    def open(self) -> None:
        """Create the HTTP session (needs a running event loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.endpoint.ssl, limit=32))

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        auth = self.endpoint.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    def _get(self, path: str, params: Mapping[str, str], timeout: aiohttp.ClientTimeout) -> Any:
        self.open()
        assert self._session is not None
        url = self.endpoint.host + path
        return self._session.get(url, params=dict(params), headers=self._headers(), timeout=timeout)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        answer: Answer = "object",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Any:
        """One request. Its answer decoded with the bound as one object (an object nested too deeply comes
        back quarantined) or a list (each item so), or read and dropped (``"none"``: a write's answer,
        which nobody needs and a user's object may nest without bound). Raises :class:`ApiError`."""
        self.open()
        assert self._session is not None
        headers = self._headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body, separators=(",", ":")).encode()
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(CONNECT_TIMEOUT_S, timeout_s))
        url = self.endpoint.host + path
        try:
            async with self._session.request(
                method, url, params=dict(params or {}), data=data, headers=headers, timeout=timeout
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(UNREACHABLE, "Unreachable", f"{method} {path}: {exc!r}"[:500]) from exc
        if status >= 400:
            raise _error(status, raw)
        if answer == "none" or not raw:
            return None
        if answer == "list":
            return boundedjson.decode_list(raw, self.max_depth)
        return boundedjson.decode_object(raw, self.max_depth)

    async def list(self, path: str, params: Mapping[str, str]) -> Mapping[str, Any]:
        """One page of a list (``params``: limit, continue, selectors); each item quarantined if too deep."""
        value = await self.request("GET", path, params=params, answer="list", timeout_s=LIST_TIMEOUT_S)
        if not isinstance(value, Mapping) or not isinstance(value.get("items"), list):
            raise ApiError(200, "NotAList", f"{path} did not answer with a list")
        return value

    async def watch(self, path: str, params: Mapping[str, str], server_timeout_s: int) -> AsyncIterator[Any]:
        """The events of one watch request, each decoded (its object quarantined if too deep); ends with the
        stream (the server closes it after ``server_timeout_s``)."""
        query = {**params, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(server_timeout_s)}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=server_timeout_s + 30)
        async with self._get(path, query, timeout) as response:
            if response.status >= 400:
                raise _error(response.status, await response.read())
            buffer = bytearray()
            async for chunk in response.content.iter_any():
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if line.strip():
                        yield boundedjson.decode_event(line, self.max_depth)
                if len(buffer) > MAX_EVENT_BYTES:
                    raise ApiError(413, "EventTooLarge", f"a watch event of {path} exceeded {MAX_EVENT_BYTES} bytes")
            if buffer.strip():
                yield boundedjson.decode_event(bytes(buffer), self.max_depth)
