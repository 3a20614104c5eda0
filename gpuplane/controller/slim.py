"""What the informers hand on of a watched object: cut to what the controller reads, as it is decoded.

A ResourceSlice of an HGX node decodes to about 260 kB of Python objects; under kopf every watched
body was alive at once at start-up (1.08 GB at 1,000 KWOK nodes). The informers
(:mod:`gpuplane.informer`) keep no body, but a page of slices is still decoded whole.

:class:`Slimmer` is the transform every controller stream (:mod:`gpuplane.controller.caches`) applies
to each object as it is decoded (list items and watch events), the way client-go informers take a
transform function:

* ``metadata.managedFields`` is dropped from every object (nothing in the controller reads it);
* a ResourceSlice is reduced at once to its :class:`~gpuplane.controller.node.slice_index.SliceDigest`
  (what the slice index stores), kept under :data:`DIGEST` (None: not this driver's, or unreadable),
  beside ``spec.driver``, ``spec.nodeName`` and ``spec.pool``; the devices and counter sets are not
  kept. ``caches.SliceIndexer`` indexes the digest as it finds it, so the index is the
  same as from the full body (``tests/unit/controller/test_slim.py``).

An object the bounded decoder quarantined (nested too deeply) is passed through as it is, so its
handlers still refuse it with an Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplane.controller import rejects
from gpuplane.controller.node import slice_index

DIGEST = "gpuplaneSliceDigest"  # top-level key of a slimmed ResourceSlice: its SliceDigest (or None)
SLICE_KIND = "ResourceSlice"
_KEPT_SLICE_SPEC = ("driver", "nodeName", "pool")


class Slimmer:
    """The decode-time transform; one per process (its interner shares MIG devices fleet-wide)."""

    def __init__(self, interner: slice_index.Interner | None = None) -> None:
        self.interner = slice_index.Interner() if interner is None else interner

    def __call__(self, obj: Any, kind: str = "") -> Any:
        """``obj`` cut to what the controller reads (``kind``: the object's, when it does not say)."""
        if not isinstance(obj, dict) or rejects.rejected(obj):
            return obj
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)
        if (obj.get("kind") or kind) != SLICE_KIND:
            return obj
        spec = obj.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        name = meta.get("name") if isinstance(meta, dict) else None
        digest = slice_index.digest(name if isinstance(name, str) else "", spec, self.interner)
        slim: dict[str, Any] = {k: v for k, v in obj.items() if k != "spec"}
        slim["spec"] = {k: spec[k] for k in _KEPT_SLICE_SPEC if k in spec}
        slim[DIGEST] = digest
        return slim


def digest_of(body: Mapping[str, Any]) -> tuple[bool, slice_index.SliceDigest | None]:
    """(True, its digest) for a slimmed slice; (False, None) for a full body (digest it yourself)."""
    if DIGEST not in body:
        return False, None
    got = body.get(DIGEST)
    return True, got if isinstance(got, slice_index.SliceDigest) else None
