"""kopf's start-up barrier ("every object indexed") without a wake-up of every waiting worker per object.

kopf (1.45) makes every object's worker wait, after the object's index handlers, until the operator
is fully indexed: ``operator_indexed`` is a ``ToggleSet(all)`` holding one "off" toggle per object
not yet indexed, and each worker awaits ``wait_for(True)`` on it. Both ``make_toggle`` (a new object
seen by the watcher) and ``drop_toggle`` (an object indexed) call ``notify_all`` on the set's
condition, which wakes every waiting worker to re-check the set. With N objects that is O(N²)
wake-ups: on a 1,000-node KWOK fleet (5,000 slices, 1,000 nodes) the controller's event loop spent its
time in them (py-spy: ``ToggleSet.make_toggle`` -> ``Condition.notify_all`` the busiest frames), its
paged listing fell so far behind that the API server's continue token expired ("The provided continue
parameter is too old") and kopf stopped the operator.

For a set that is on when *all* its toggles are on, adding an off toggle can never turn it on, and
dropping one turns it on only when no off toggle is left, so :func:`install` changes exactly those
two methods for ``all`` sets: no notification when an off toggle is added, and after a drop only
when the set is now on. kopf waits only for ``True`` on its ``all`` set (``operator_indexed``); its
``any`` set (``operator_paused``, waited for both ways) is left as it is.
``tests/unit/test_kopf_indexing.py`` checks both, on kopf's own class.
"""

from __future__ import annotations

from typing import Any

from kopf._cogs.aiokits import aiotoggles

_MARK = "_gpuplane_quiet_all_sets"


def install() -> None:
    """Patch kopf's ToggleSet for ``all`` sets (idempotent)."""
    cls: Any = aiotoggles.ToggleSet
    if getattr(cls, _MARK, False):
        return
    make_toggle, drop_toggle = cls.make_toggle, cls.drop_toggle

    async def quiet_make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
        if self._fn is not all or __val:
            return await make_toggle(self, __val, name=name)
        toggle = aiotoggles.Toggle(False, name=name, condition=self._condition)
        async with self._condition:
            self._toggles.add(toggle)  # an off toggle cannot turn an all-set on: nobody to wake
        return toggle

    async def quiet_drop_toggle(self: Any, toggle: Any) -> None:
        if self._fn is not all:
            await drop_toggle(self, toggle)
            return
        async with self._condition:
            self._toggles.discard(toggle)
            if self.is_on():  # the last off toggle went: now the waiters for "on" may go
                self._condition.notify_all()

    cls.make_toggle, cls.drop_toggle = quiet_make_toggle, quiet_drop_toggle
    setattr(cls, _MARK, True)
