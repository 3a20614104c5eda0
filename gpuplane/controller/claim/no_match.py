"""Why a request's selectors admit no GPU at all: an attribute no GPU publishes, or a filter nothing passes.

``checks.explain_requests`` counts free GPUs among those the selectors admit; when they admit none,
"0 free in all" is wrong (the cluster may be idle) and says nothing of the cause. This module
names it instead: a selector that reads ``device.attributes["<domain>"].<name>`` which no GPU
publishes makes the scheduler's CEL fail at run time (no such key: nothing is ever allocated);
otherwise the DeviceClass's (and the request's) selectors match no GPU of the cluster.
Pure: the request's parts and the placement view in, one sentence out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from gpuplane.controller.node import snapshot_builder

# device.attributes["domain"].name or device.attributes["domain"]["name"]; has(...) guards are left alone.
_ATTRIBUTE = re.compile(
    r'(?<!has\()device\.attributes\[\s*"([^"]{1,253})"\s*\](?:\.([A-Za-z_]\w{0,62})|\[\s*"([^"]{1,63})"\s*\])'
)
_SHOWN = 6


def unpublished(expressions: Iterable[str], published: frozenset[str]) -> list[tuple[str, str]]:
    """(domain, name) of each attribute the expressions read unguarded that no GPU publishes, in order."""
    out: list[tuple[str, str]] = []
    for expr in expressions:
        for m in _ATTRIBUTE.finditer(expr[:4096]):
            domain, name = m.group(1), m.group(2) or m.group(3)
            if f"{domain}/{name}" not in published and (domain, name) not in out:
                out.append((domain, name))
    return out


def reason(
    request: str,
    device_class: str,
    class_exprs: Sequence[str],
    request_exprs: Sequence[str],
    view: snapshot_builder.ClusterView,
) -> str:
    """The sentence for a request whose selectors admit no GPU of ``view``."""
    published = frozenset(k for g in view.gpus for k in g.attributes)
    missing = unpublished([*class_exprs, *request_exprs], published)
    if missing:
        domain, name = missing[0]
        known = sorted(k.split("/", 1)[1] for k in published if k.startswith(f"{domain}/"))
        shown = ", ".join(known[:_SHOWN]) + (", ..." if len(known) > _SHOWN else "")
        return (
            f'request {request}: a selector reads device.attributes["{domain}"].{name}, which no GPU publishes: '
            "the scheduler's CEL fails at run time (no such key) and allocates nothing; use a published "
            f"attribute ({shown or 'none in that domain'}) or guard it with has()"
        )
    snap = view.snapshot(None)
    total = sum(len(n.gpus) for d in snap.domains for n in d.nodes)
    free = sum(d.free_whole for d in snap.domains)
    whose = f"DeviceClass {device_class}" + (f" and request {request}" if request_exprs else "")
    return (
        f"request {request}: no GPU matches the selectors of {whose} ({free} of {total} GPUs free); "
        "check the selectors against the GPUs' attributes (kubectl get resourceslices -o yaml)"
    )
