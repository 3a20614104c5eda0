"""kopf's per-object memory, kept for a fleet object only while it holds something.

kopf (1.45) remembers every object it has seen until the object is deleted: a ``ResourceMemory``
with an error ``Throttler``, an ``IndexingMemory``, a ``DaemonsMemory`` (an empty set and dict), the
object's copy of the operator's memo, and each one's attribute dict, about 930 bytes an object
(measured: 18.6 MB for 20,000). On a 1,000-node fleet with 10,000 claims the controller watches about
20,000 pods, claims, slices and nodes, and the memory report listed these five kinds among the
largest (docs/benchmarks.md, run 5).

For those resources the controller registers index handlers and ``on.event`` handlers only, and for
them kopf reads the memory within one event and never after:

* no daemons or timers (``daemons_memory`` stays empty; timers are on GpuGangs and GpuRequests);
* no create/update/resume handlers (``noticed_by_listing`` and ``fully_handled_once`` are read only
  for those);
* ``remaining_patch`` is None: the handlers patch nothing through kopf;
* ``indexing_memory.indexing_state`` is None while the index handlers succeed (they refuse bad
  objects by returning None, never by raising), and the error throttler is inactive until an error.

:func:`install` wraps kopf's ``process_resource_event`` so that, for the resources named, an
object's memory is forgotten after each event when all of the above hold; otherwise (an index
handler failed and kopf retries it, a throttle is running) it is kept as kopf keeps it, until the
next event that finds it idle. The next event makes a fresh one. The operator's memo is a
:class:`~gpuplane.controller.runtime.Runtime`, whose copy is itself (its mutable state is shared).
``tests/unit/test_kopf_memories.py`` checks both cases on kopf's own classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kopf._core.reactor import inventory, processing

from gpuplane.controller.kopf_barrier import FLEET_PLURALS

_MARK = "_gpuplane_forget_idle_memories"


def idle(memory: inventory.ResourceMemory) -> bool:
    """Whether kopf's memory of an object holds nothing a later event would read."""
    throttler, daemons = memory.error_throttler, memory.daemons_memory
    return (
        memory.remaining_patch is None
        and memory.indexing_memory.indexing_state is None
        and throttler.active_until is None
        and throttler.source_of_delays is None
        and daemons.live_fresh_body is None
        and not daemons.running_daemons
        and not daemons.forever_stopped
    )


def install(plurals: Iterable[str] = FLEET_PLURALS) -> None:
    """Wrap kopf's event processor (idempotent; before ``kopf.spawn_tasks``, which binds it)."""
    if getattr(processing.process_resource_event, _MARK, False):
        return
    original = processing.process_resource_event
    forgettable = frozenset(plurals)

    async def process_resource_event(**kw: Any) -> Any:
        try:
            return await original(**kw)
        finally:
            memories, resource = kw.get("memories"), kw.get("resource")
            body = (kw.get("raw_event") or {}).get("object")
            if (
                isinstance(memories, inventory.ResourceMemories)
                and getattr(resource, "plural", None) in forgettable
                and isinstance(body, dict)
            ):
                raw: Any = body
                memory = memories._items.get(memories._build_key(raw))
                if memory is not None and idle(memory):
                    await memories.forget(raw)

    setattr(process_resource_event, _MARK, True)
    processing.process_resource_event = process_resource_event  # type: ignore[assignment]
