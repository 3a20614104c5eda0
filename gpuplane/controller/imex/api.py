"""The ``ImexDomain`` objects in the API: listed, created, their spec replaced, deleted. Does I/O.

Through the controller's one client (:class:`gpuplane.controller.kube.KubeWriter`): every write is fenced
(a replica that lost the lease writes nothing) and tolerates having been done already (create -> 409 and
delete -> 404 are done), so a pass repeated after a crash at any point converges. The list is read through
the bounded decoder (:mod:`gpuplane.api.boundedjson`): an object nested too deeply comes back quarantined,
which the parser refuses like any other garbled object. Only the controller's namespace is read and written
(the Role ``gpuplane-controller-imex`` grants nothing else).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from gpuplane.api import imex
from gpuplane.controller import kube
from gpuplane.controller.imex.objects import MANAGED_BY, Diff
from gpuplane.informer.client import ApiError, Resource

DOMAINS = Resource(imex.GROUP, imex.VERSION, imex.PLURAL)


class ImexApi:
    """The four calls a pass makes, in ``namespace``."""

    def __init__(self, writer: kube.KubeWriter, namespace: str = imex.NAMESPACE) -> None:
        self.writer = writer
        self.namespace = namespace

    def existing(self) -> list[dict[str, Any]]:
        """Every ``ImexDomain`` in the namespace (the controller's own and anything else there)."""
        return self.writer.list_objects(DOMAINS, self.namespace)

    def create(self, body: Mapping[str, Any]) -> None:
        try:
            self.writer.create(DOMAINS, self.namespace, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            self.replace_spec(body)  # made by an earlier pass whose answer was lost: make its spec ours

    def replace_spec(self, body: Mapping[str, Any]) -> None:
        """Merge-patch the whole spec (every field of it is replaced: lists and strings) and our labels."""
        name = str(body["metadata"]["name"])
        patch = {"metadata": {"labels": dict(MANAGED_BY)}, "spec": body["spec"]}
        self.writer.patch(DOMAINS, self.namespace, name, patch)

    def delete(self, name: str) -> None:
        try:
            self.writer.delete(DOMAINS, self.namespace, name)
        except ApiError as exc:
            if exc.status != 404:
                raise

    def apply(self, diff: Diff) -> list[str]:
        """Deletes first (a node leaves its old domain before it joins a new one), then creates and updates;
        every write tried. Returns what failed, as ``"<verb> <name>: <why>"`` (NotLeader is raised)."""
        failed: list[str] = []
        steps: list[tuple[str, str, Callable[[], None]]] = [
            ("delete", n, functools.partial(self.delete, n)) for n in diff.delete
        ]
        steps += [("create", _name(o), functools.partial(self.create, o)) for o in diff.create]
        steps += [("update", _name(o), functools.partial(self.replace_spec, o)) for o in diff.update]
        for verb, name, write in steps:
            try:
                write()
            except ApiError as exc:
                failed.append(f"{verb} {name}: {exc.status} {exc.said}")
        return failed


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")
