"""Who is asking, and may they: TokenReview and SubjectAccessReview, with a small bounded cache.

:class:`Gate` answers an ``Authorization`` header for a verb and path with a
:class:`Verdict`: 401 (no token, a token the API server does not accept),
403 (a valid token without the right), 200, or 503 when the API server could not
be asked (never cached, so the next scrape asks again). Reviews are cached for a
few seconds by the token's SHA-256 (never the token itself), at most
``entries`` of them, the least recently used dropped first, so a flood of made-up
tokens costs a bounded amount of memory; the connection cap of the server bounds
how many reviews run at once.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

MAX_TOKEN_BYTES = 16 * 1024  # a service-account JWT is ~1 KiB; anything far longer is not a token


@dataclasses.dataclass(frozen=True)
class Identity:
    """An authenticated user, as the TokenReview reported it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The answer to one request: an HTTP status and why (for the log, not the body's secrets)."""

    status: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


class ReviewFailed(Exception):
    """The API server could not be asked (network, 5xx, throttled): answer 503, cache nothing."""


class Reviewer(Protocol):
    """The two questions for the API server."""

    def authenticate(self, token: str) -> Identity | None:
        """The token's user, or None when the API server does not accept the token."""

    def authorize(self, who: Identity, verb: str, path: str) -> bool:
        """Whether ``who`` may ``verb`` the non-resource URL ``path``."""


class Requests(Protocol):
    """One request to the API server, its answer decoded (:class:`gpuplane.informer.blocking.BlockingClient`)."""

    def request(self, method: str, path: str, *, body: Any = None, timeout_s: float = ...) -> Any: ...


class RequestReviewer:
    """:class:`Reviewer` over the Kubernetes API (authentication.k8s.io/v1, authorization.k8s.io/v1), through
    either program's client: the controller's :class:`~gpuplane.informer.blocking.BlockingClient`, the
    driver's :class:`~gpuplane.driver.kube.ReviewRequests`. Answers are read as untrusted: a field of the
    wrong type reads as absent (not authenticated, not allowed)."""

    def __init__(self, api: Requests, *, timeout_s: float = 5.0) -> None:
        self._api = api
        self._timeout_s = timeout_s

    def _post(self, what: str, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        try:
            answer = self._api.request("POST", path, body=dict(body), timeout_s=self._timeout_s)
        except Exception as exc:
            raise ReviewFailed(f"{what} failed: {exc.__class__.__name__}") from exc
        status = answer.get("status") if isinstance(answer, Mapping) else None
        return status if isinstance(status, Mapping) else {}

    def authenticate(self, token: str) -> Identity | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        status = self._post("TokenReview", "/apis/authentication.k8s.io/v1/tokenreviews", body)
        user = status.get("user")
        if status.get("authenticated") is not True or not isinstance(user, Mapping):
            return None
        groups, extra = user.get("groups"), user.get("extra")
        return Identity(
            str(user.get("username") or ""),
            str(user.get("uid") or ""),
            tuple(str(g) for g in groups) if isinstance(groups, list) else (),
            tuple(sorted((str(k), tuple(str(x) for x in v) if isinstance(v, list) else ()) for k, v in extra.items()))
            if isinstance(extra, Mapping)
            else (),
        )

    def authorize(self, who: Identity, verb: str, path: str) -> bool:
        spec: dict[str, Any] = {"user": who.username, "nonResourceAttributes": {"path": path, "verb": verb}}
        if who.uid:
            spec["uid"] = who.uid
        if who.groups:
            spec["groups"] = list(who.groups)
        if who.extra:
            spec["extra"] = {k: list(v) for k, v in who.extra}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        status = self._post("SubjectAccessReview", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
        return status.get("allowed") is True


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None: absent, another scheme, empty)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


class Gate:
    """Authentication and authorization of requests, reviews cached by token digest."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        ttl_s: float = 10.0,
        entries: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if entries < 1:
            raise ValueError("entries must be at least 1")
        self._reviewer = reviewer
        self._ttl_s = ttl_s
        self._entries = entries
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[str, str, str], tuple[float, Verdict]] = collections.OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    def check(self, authorization: str | None, verb: str, path: str) -> Verdict:
        """The verdict on a request to ``verb`` ``path`` with this ``Authorization`` header."""
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "no bearer token")
        if len(token) > MAX_TOKEN_BYTES:
            return Verdict(401, "token too long")
        key = (hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest(), verb, path)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                self._cache.move_to_end(key)
                return hit[1]
        try:
            verdict = self._review(token, verb, path)
        except ReviewFailed as exc:
            return Verdict(503, str(exc))
        if self._ttl_s > 0:
            with self._lock:
                self._cache[key] = (now + self._ttl_s, verdict)
                self._cache.move_to_end(key)
                while len(self._cache) > self._entries:
                    self._cache.popitem(last=False)
        return verdict

    def _review(self, token: str, verb: str, path: str) -> Verdict:
        who = self._reviewer.authenticate(token)
        if who is None:
            return Verdict(401, "token not accepted by the API server")
        if not self._reviewer.authorize(who, verb, path):
            return Verdict(403, f"{who.username} may not {verb} {path}", who.username)
        return Verdict(200, "allowed", who.username)


def verdict_headers(verdict: Verdict) -> Mapping[str, str]:
    """Extra headers of a refusal (401 asks for a bearer token, as RFC 6750 says)."""
    return {"WWW-Authenticate": 'Bearer realm="gpuplane"'} if verdict.status == 401 else {}
