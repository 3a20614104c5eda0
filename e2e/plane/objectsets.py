"""Compare two rendered sets of Kubernetes objects (kustomize's and helm's) after normalising.

Objects are keyed by (kind, namespace, name). Normalising removes what
legitimately differs between the two tools and nothing else:

* the ``app.kubernetes.io/managed-by`` label (``kustomize`` / ``Helm``) on an object
  and on its pod template (and an empty ``labels`` map left behind);
* the ``app.kubernetes.io/version`` label of a CustomResourceDefinition: Helm
  installs a chart's ``crds/`` verbatim (never templated, so never relabelled),
  while the kustomize base labels every object;
* runs of whitespace in CEL expressions (``rule``, ``expression``,
  ``messageExpression``), which CEL ignores: kustomize's YAML library folds a
  ``>-`` block whose continuation lines are more indented with an extra newline
  (the YAML spec, and Helm, keep one), so the same file gives two strings.

Everything else (every field of every spec, every other label) must be equal;
:func:`differences` lists each place where it is not, as a path and both values.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator
from typing import Any

TOOL_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
CRD_LABELS = ("app.kubernetes.io/version",)
CEL_KEYS = frozenset({"rule", "expression", "messageExpression"})

Key = tuple[str, str, str]


def key(obj: dict[str, Any]) -> Key:
    """(kind, namespace or '', name)."""
    meta = obj.get("metadata") or {}
    return str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))


def _strip_labels(meta: dict[str, Any], names: Iterable[str]) -> None:
    labels = meta.get("labels")
    if isinstance(labels, dict):
        for label in names:
            labels.pop(label, None)
        if not labels:
            meta.pop("labels")


def _squash_cel(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: re.sub(r"\s+", " ", v).strip() if k in CEL_KEYS and isinstance(v, str) else _squash_cel(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_squash_cel(v) for v in node]
    return node


def normalise(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` without what the tools differ in by design (see the module docstring)."""
    out: dict[str, Any] = _squash_cel(copy.deepcopy(obj))
    labels = TOOL_LABELS + (CRD_LABELS if out.get("kind") == "CustomResourceDefinition" else ())
    _strip_labels(out.setdefault("metadata", {}), labels)
    template = (out.get("spec") or {}).get("template")
    if isinstance(template, dict) and isinstance(template.get("metadata"), dict):
        _strip_labels(template["metadata"], TOOL_LABELS)
    return out


def index(objects: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Normalised objects by key; a key seen twice is an error."""
    out: dict[Key, dict[str, Any]] = {}
    for obj in objects:
        k = key(obj)
        if k in out:
            raise ValueError(f"{k} rendered twice")
        out[k] = normalise(obj)
    return out


def _walk(path: str, left: Any, right: Any) -> Iterator[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        for name in sorted(set(left) | set(right)):
            if name not in right:
                yield f"{path}.{name}: only in the first ({left[name]!r})"
            elif name not in left:
                yield f"{path}.{name}: only in the second ({right[name]!r})"
            else:
                yield from _walk(f"{path}.{name}", left[name], right[name])
    elif isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            yield from _walk(f"{path}[{i}]", a, b)
    elif left != right:
        yield f"{path}: {left!r} != {right!r}"


def differences(first: Iterable[dict[str, Any]], second: Iterable[dict[str, Any]]) -> list[str]:
    """Every difference between two object sets (empty when they are the same after normalising)."""
    a, b = index(first), index(second)
    out = [f"{k}: only in the first" for k in sorted(set(a) - set(b))]
    out += [f"{k}: only in the second" for k in sorted(set(b) - set(a))]
    for k in sorted(set(a) & set(b)):
        out += [f"{k}: {line}" for line in _walk("", a[k], b[k])]
    return out
