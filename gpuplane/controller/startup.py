"""What the fleet-sized resources' handlers deferred until kopf's start-up barrier opened, done once.

Before every object is indexed (:mod:`gpuplane.controller.kopf_barrier`), a node or slice event
only records its node and a claim event its claim (the body as the handler would read it); when
the barrier opens, :func:`replay` labels each recorded node from the complete slice index (once per
node, where the events would have done it once per slice) and checks each recorded claim that still
exists. Nothing is lost: an object whose event came before the barrier is in the record, and any
later event runs its handler as usual.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from gpuplane.controller import kopf_barrier

log = structlog.get_logger(__name__)
LABEL_CONCURRENCY = 8  # node label writes in flight during the replay (each is one PATCH and one Event)


@dataclasses.dataclass
class Deferred:
    """What the handlers recorded while the barrier was closed."""

    nodes: set[str] = dataclasses.field(default_factory=set)
    claims: dict[str, tuple[bool, dict[str, Any]]] = dataclasses.field(default_factory=dict)  # key -> (rejected, body)

    def node(self, name: str) -> None:
        """Label ``name`` once the indexes are complete."""
        self.nodes.add(name)

    def claim(self, key: str, body: dict[str, Any], *, rejected: bool) -> None:
        """Check the claim ``key`` (``namespace/name``) once the indexes are complete (the latest body wins)."""
        self.claims[key] = (rejected, body)


async def replay(
    deferred: Deferred,
    label: Callable[[str], Awaitable[None]],
    check: Callable[[str, dict[str, Any], bool], Awaitable[None]],
    claim_exists: Callable[[str], bool],
) -> tuple[int, int]:
    """After the barrier: label the recorded nodes, check the recorded claims; returns (nodes, claims) done."""
    await kopf_barrier.wait_indexed()
    nodes, deferred.nodes = sorted(deferred.nodes), set()
    claims, deferred.claims = deferred.claims, {}
    log.info("start-up barrier open: replaying deferred handlers", nodes=len(nodes), claims=len(claims))
    gate = asyncio.Semaphore(LABEL_CONCURRENCY)

    async def one(node: str) -> None:
        async with gate:
            try:
                await label(node)
            except Exception:  # one node's failure must not stop the others; its next event retries
                log.exception("labelling a node after start-up failed", node=node)

    await asyncio.gather(*(one(n) for n in nodes))
    checked = 0
    for key, (rejected, body) in claims.items():
        if not rejected and not claim_exists(key):
            continue  # deleted meanwhile
        try:
            await check(key, body, rejected)
            checked += 1
        except Exception:
            log.exception("checking a claim after start-up failed", claim=key)
        await asyncio.sleep(0)
    log.info("deferred handlers replayed", nodes=len(nodes), claims=checked)
    return len(nodes), checked


def exists_in(index: Mapping[Any, Any]) -> Callable[[str], bool]:
    """A claim-exists test over kopf's claim index."""
    return lambda key: key in index
