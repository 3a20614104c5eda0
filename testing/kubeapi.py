"""An API server in memory behind the controller's ``request`` (:class:`gpuplane.controller.kube.Api`).

Objects are kept by path (``/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>``); GET of an object
or a collection, POST (409 when it exists), PUT, PATCH (JSON merge patch and strategic merge patch merge
as a merge patch; a JSON patch is recorded, not applied) and DELETE (404 when absent) behave as the API
server's do for the writer. Every request is recorded in :attr:`FakeApi.calls`; ``fail`` answers a
method and path (or a path's last segments) with an error status instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.informer.client import JSON, JSON_PATCH, ApiError


@dataclass(frozen=True)
class Call:
    """One request as the writer made it."""

    method: str
    path: str
    params: Mapping[str, str]
    body: Any
    content_type: str


def _merge(into: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(into)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


class FakeApi:
    """The API server's answers to the controller's writes and reads, kept in :attr:`objects`."""

    def __init__(
        self,
        objects: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        fail: Mapping[tuple[str, str], int] | None = None,
        message: str = "",
        causes: tuple[str, ...] = (),
    ) -> None:
        self.objects: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (objects or {}).items()}
        self.fail = dict(fail or {})  # (method, path or its tail) -> status
        self.message, self.causes = message, causes  # of every failure (a PodDisruptionBudget's, say)
        self.calls: list[Call] = []

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        answer: str = "object",
        timeout_s: float = 30.0,
    ) -> Any:
        """One request: recorded, then failed as ``fail`` says, else answered from :attr:`objects`."""
        self.calls.append(Call(method, path, dict(params or {}), body, content_type))
        for (m, tail), status in self.fail.items():
            if m == method and (path == tail or path.endswith("/" + tail.lstrip("/"))):
                raise ApiError(status, f"Status{status}", self.message or f"{method} {path} failed", self.causes)
        if method == "GET":
            if path in self.objects:
                return self.objects[path]
            items = [o for p, o in sorted(self.objects.items()) if p.rsplit("/", 1)[0] == path]
            if items or answer == "list":
                return {"items": items}
            raise ApiError(404, "NotFound", f"{path} not found")
        if method == "POST":
            name = str((body.get("metadata") or {}).get("name") or "") if isinstance(body, Mapping) else ""
            where = f"{path}/{name}"
            if not name or path.endswith(("/eviction", "reviews")):
                return {}
            if where in self.objects:
                raise ApiError(409, "AlreadyExists", f"{where} exists")
            self.objects[where] = dict(body)
            return body
        target = path.removesuffix("/status")
        if target not in self.objects:
            raise ApiError(404, "NotFound", f"{target} not found")
        if method == "DELETE":
            return self.objects.pop(target)
        if method == "PUT":
            self.objects[target] = dict(body)
        elif method == "PATCH" and content_type != JSON_PATCH and isinstance(body, Mapping):
            self.objects[target] = _merge(self.objects[target], body)
        return self.objects[target]

    def paths(self, method: str) -> list[str]:
        """The paths of the requests of one method, in order."""
        return [c.path for c in self.calls if c.method == method]
