"""Decode Kubernetes API JSON with bounded nesting, so no object a user writes can make a reader recurse.

The API server stores objects nested thousands of levels deep (a claim's opaque
``parameters`` are free-form JSON). Python's ``json`` recurses once per level and
raises ``RecursionError`` near 1,000 levels, and every later recursive walk
(``copy.deepcopy``, pydantic, ``json.dumps``) fails far earlier: one such claim
stopped both controller replicas. :func:`decode` measures the depth first, with no
recursion (one regex pass skipping string literals, then a C-speed scan of the
brackets); a document within ``max_depth`` goes to ``json.loads`` unchanged, and
every deeper container is cut out of the text and replaced by the string
:data:`TOO_DEEP` before parsing, so the rest (a list's other items, an object's
metadata) still decodes. :func:`quarantine` marks an object that lost a subtree
with :data:`REJECTED` (what was too deep, where), which readers refuse with a
specific error instead of crashing.

Depths count containers: ``{}`` is 1, ``{"a": []}`` is 2. Kubernetes objects
gpuplane reads nest at most 14 levels (CustomResourceDefinitions, measured on the
e2e cluster with managedFields; pods 11, nodes 9, ResourceSlices 8), so the
64-level bound of :data:`MAX_OBJECT_DEPTH` refuses nothing real.

Decoded, a field still holds whatever its writer put there: :func:`mapping` and :func:`mappings` read a
field that should be an object, or a list of objects, as empty when it is anything else.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

MAX_OBJECT_DEPTH = 64
TOO_DEEP = "\x00gpuplane: nested too deeply"  # replaces every cut-out container; not valid in any Kubernetes field
REJECTED = "gpuplane.dev/rejected"  # top-level key of a quarantined object: why it was not decoded
_TOO_DEEP_LITERAL = json.dumps(TOO_DEEP)

# A JSON string literal (unrolled loop: linear, no backtracking), or one structural bracket.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_BRACKETS = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "[]{}"))
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}

# Metadata a quarantined object keeps (all flat, or maps/lists of strings).
_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
)


class DecodeError(ValueError):
    """The text is not JSON (the message says where)."""


@dataclass(frozen=True)
class Decoded:
    """A decoded document; ``pruned`` when containers deeper than the bound were replaced by TOO_DEEP."""

    value: Any
    pruned: bool
    depth: int  # the document's nesting depth as measured (before pruning)


def depth_of(text: str) -> int:
    """Nesting depth of a JSON text, without parsing it (brackets inside string literals do not count).

    Escaped backslashes, then escaped quotes, are dropped first, so every quote left delimits a string
    (exact for valid JSON; on invalid JSON json.loads fails anyway).
    """
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(unescaped.split('"')[0::2])
    brackets = outside.translate(_BRACKETS)
    steps = map(_STEP.get, brackets, itertools.repeat(0))  # 0 for anything else (only in invalid JSON)
    return max(0, max(itertools.accumulate(steps), default=0))


def _pruned_text(text: str, max_depth: int) -> str:
    """The text with every container that opens below ``max_depth`` replaced by the TOO_DEEP literal."""
    out: list[str] = []
    depth = 0
    cut_from = -1
    last = 0
    for match in _TOKEN.finditer(text):
        tok = match.group()
        if tok[0] == '"':
            continue
        if tok in "[{":
            depth += 1
            if depth == max_depth + 1:
                cut_from = match.start()
        else:
            if depth == max_depth + 1 and cut_from >= 0:
                out.append(text[last:cut_from])
                out.append(_TOO_DEEP_LITERAL)
                last = match.end()
                cut_from = -1
            depth -= 1
    out.append(text[last:])
    return "".join(out)


def decode(data: bytes | str, max_depth: int) -> Decoded:
    """Decode JSON so that no container deeper than ``max_depth`` is built (those become TOO_DEEP)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    except UnicodeDecodeError as exc:
        raise DecodeError(f"not UTF-8: {exc}") from exc
    depth = depth_of(text)
    source = text if depth <= max_depth else _pruned_text(text, max_depth)
    try:
        value = json.loads(source)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise DecodeError(f"not JSON: {str(exc)[:200]}") from exc
    return Decoded(value=value, pruned=depth > max_depth, depth=depth)


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every (path, value) of a decoded (hence bounded) document, depth first, without recursion."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, node = stack.pop()
        yield where, node
        if isinstance(node, Mapping):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(node))))


def first_cut(value: Any) -> str | None:
    """Path of the first TOO_DEEP marker in a decoded value, or None when nothing was cut."""
    for where, node in _walk(value, ""):
        if isinstance(node, str) and node == TOO_DEEP:
            return where
    return None


def _short_path(path: str, limit: int = 160) -> str:
    return path if len(path) <= limit else f"{path[: limit // 2]}…{path[-limit // 4 :]}"


def quarantine(obj: Any, max_depth: int = MAX_OBJECT_DEPTH) -> Any:
    """``obj`` unchanged when nothing in it was cut; else the cut object marked with :data:`REJECTED`.

    What was not too deep stays (metadata, the claim's requests, its status), so a reader can still
    tell whose object it is; every cut subtree is the string :data:`TOO_DEEP`, and
    ``metadata.managedFields`` (which mirrors the deep fields) is dropped. ``max_depth`` is the
    bound relative to ``obj`` (used in the message only).
    """
    where = first_cut(obj)
    if where is None:
        return obj
    if not isinstance(obj, Mapping):
        return {REJECTED: f"the document nests JSON deeper than {max_depth} levels; gpuplane does not read it"}
    # Name the user's field rather than its managedFields mirror, which nests as deep.
    where = first_cut({k: v for k, v in obj.items() if k != "metadata"}) or where
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, Mapping):
        out["metadata"] = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    out[REJECTED] = (
        f"the object nests JSON deeper than {max_depth} levels (at {_short_path(where)}); gpuplane does not read "
        f"it: delete it and write it with at most {max_depth} levels (gpuplane's configs need 4)"
    )
    return out


def rejection(obj: Any) -> str | None:
    """The reason a decoded object was quarantined, or None for an ordinary object."""
    if isinstance(obj, Mapping):
        reason = obj.get(REJECTED)
        return str(reason) if reason is not None else None
    return None


def decode_object(data: bytes | str, max_depth: int = MAX_OBJECT_DEPTH) -> Any:
    """One API object (a GET or write response): quarantined when it nests deeper than ``max_depth``."""
    decoded = decode(data, max_depth)
    return quarantine(decoded.value, max_depth) if decoded.pruned else decoded.value


def decode_list(data: bytes | str, max_depth: int = MAX_OBJECT_DEPTH) -> Any:
    """A list response (``{"items": [...]}``): each item deeper than ``max_depth`` quarantined, the rest intact."""
    decoded = decode(data, max_depth + 2)  # list -> items -> item
    value = decoded.value
    if decoded.pruned and isinstance(value, dict) and isinstance(value.get("items"), list):
        value["items"] = [quarantine(item, max_depth) for item in value["items"]]
    elif decoded.pruned:
        value = quarantine(value, max_depth)
    return value


def decode_event(data: bytes | str, max_depth: int = MAX_OBJECT_DEPTH) -> Any:
    """A watch event (``{"type": ..., "object": {...}}``): its object quarantined when deeper than ``max_depth``."""
    decoded = decode(data, max_depth + 1)  # event -> object
    value = decoded.value
    if decoded.pruned and isinstance(value, dict) and "object" in value:
        value["object"] = quarantine(value["object"], max_depth)
    elif decoded.pruned:
        value = quarantine(value, max_depth)
    return value


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def mappings(value: Any) -> list[Mapping[str, Any]]:
    """The mappings in ``value`` if it is a list (its other items left out), else none."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


EMPTY: Mapping[str, Any] = MappingProxyType({})
"""One read-only empty mapping, shared by every view that keeps nothing of a map."""


def empty() -> Mapping[str, Any]:
    """:data:`EMPTY` (a dataclass field's default factory)."""
    return EMPTY


def text(value: Any) -> str:
    """``value`` if it is a string, else "" (a name of another type names nothing)."""
    return value if isinstance(value, str) else ""


def strings(values: Mapping[str, Any], keys: Iterable[str]) -> Mapping[str, str]:
    """The string values of ``keys`` in ``values``, read-only (:data:`EMPTY` when none)."""
    kept = {k: values[k] for k in keys if isinstance(values.get(k), str)}
    return MappingProxyType(kept) if kept else EMPTY
