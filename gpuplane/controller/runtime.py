"""The operator's memo: the clients and configuration every handler shares, and each feature's own state.

kopf shallow-copies the memo per object, so every mutable thing lives in :class:`Shared`, referenced (not
copied) by each copy. Nothing here is a decision store: decisions live in the API (gang status, claim
annotations). A feature keeps what it caches or rate-limits in a state object of its own type, reached
with :meth:`Runtime.state` (``rt.state(gang.run.GangState)``); this module imports no feature, so every
feature may import it and none reaches another's state through it.

Every entry point first asks :meth:`Runtime.leading`: a standby replica keeps its indexes warm but decides
and writes nothing. Each feature's state is told (:meth:`TermState.new_term`) whenever this replica starts
a new leadership term, and a write refused mid-reconcile (:class:`gpuplane.controller.kube.NotLeader`)
ends the reconcile quietly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar, cast

from gpuplane.controller import config, kube, leader
from gpuplane.controller import metrics as metrics_mod
from gpuplane.informer.cache import Caches
from gpuplane.placement.policies import base as policy_base
from gpuplane.placement.policies import make as make_policy

T = TypeVar("T")


class TermState(Protocol):
    """A feature's per-process state: made from the configuration, told when a new leadership term starts."""

    @classmethod
    def create(cls, cfg: config.ControllerConfig) -> Self:
        """The state at start."""
        ...

    def new_term(self) -> None:
        """Drop what an earlier term cached (what it wrote says nothing of what is written now)."""
        ...


S = TypeVar("S", bound=TermState)


@dataclass
class Shared:
    """Mutable state shared by every memo copy (one per process)."""

    lock: asyncio.Lock | None = None
    version: int = 0  # bumped whenever an indexed object changes (:meth:`Runtime.touched`)
    term: int = 0  # the leadership term the feature states belong to
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)  # background loops (rebalancing, replay)
    states: dict[type[Any], TermState] = field(default_factory=dict)  # each feature's state, by its type


@dataclass
class Runtime:
    """What every handler gets as ``memo``."""

    cfg: config.ControllerConfig
    writer: kube.KubeWriter
    metrics: metrics_mod.ControllerMetrics
    policy: policy_base.Policy
    leadership: leader.Leadership = field(default_factory=leader.AlwaysLeader)
    shared: Shared = field(default_factory=Shared)
    caches: Caches = field(default_factory=lambda: Caches([]))  # the informers' indexes (controller.caches)

    @classmethod
    def create(
        cls,
        cfg: config.ControllerConfig,
        writer: kube.KubeWriter,
        m: metrics_mod.ControllerMetrics,
        leadership: leader.Leadership | None = None,
    ) -> Runtime:
        """Build the memo once in main()."""
        return cls(
            cfg=cfg,
            writer=writer,
            metrics=m,
            policy=make_policy(cfg.policy),
            leadership=leadership or leader.AlwaysLeader(),
        )

    def __copy__(self) -> Runtime:
        """Itself: kopf copies the memo for every object it sees; what changes lives in ``shared``."""
        return self

    def state(self, kind: type[S]) -> S:
        """The process's one ``kind`` state, made on first use (``setdefault``: two threads asking first at
        once get the same one)."""
        found = self.shared.states.get(kind)
        if found is None:
            found = self.shared.states.setdefault(kind, kind.create(self.cfg))
        return cast(S, found)

    def leading(self) -> bool:
        """Whether this replica may decide now; a new term drops what an earlier term cached."""
        if not self.leadership.is_leader():
            return False
        term = self.leadership.term
        if term != self.shared.term:
            self.shared.term = term
            for st in self.shared.states.values():
                st.new_term()
            self.metrics.leader_terms.inc()
        return True

    def touched(self) -> None:
        """An indexed object changed: the cached plan is stale."""
        self.shared.version += 1

    def lock(self) -> asyncio.Lock:
        """The process-wide reconcile lock (created lazily inside the event loop)."""
        if self.shared.lock is None:
            self.shared.lock = asyncio.Lock()
        return self.shared.lock


async def after_sync(rt: Runtime, work: Awaitable[T]) -> T:
    """``work`` awaited once every informer synced (nothing decides on half-built indexes)."""
    await rt.caches.wait_synced()
    return await work
