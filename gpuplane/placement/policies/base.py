"""The Policy protocol: how a placement policy ranks candidate classes.

``place`` never scans every GPU. It groups candidates into classes that behave
alike, asks the policy for a key per class, and breaks ties by position
(domain, node, GPU index), so every policy is deterministic:

* a partly used GPU in MIG state ``s`` (``mig_partial``);
* an empty GPU in a domain whose node empty-counts are ``sig`` (``mig_empty``);
* a TP group of ``members`` x ``gpus_per_member`` in a domain with ``sig`` (``group``).

Keys are tuples of numbers of one fixed length per method; smaller is better.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from gpuplane.placement import fragmentation, geometry, snapshot

Key = tuple[float, ...]


class Policy(Protocol):
    """Ranks candidate classes; smaller keys win, then lower positions."""

    name: str

    def mig_partial(self, slots: geometry.Slots, state: int, profile: str) -> tuple[Key, int] | None:
        """Key and start slot for ``profile`` on a partly used GPU in ``state`` (None: not there)."""
        ...

    def mig_empty(
        self, slots: geometry.Slots, profile: str, sig: snapshot.Signature, node_gpus: int
    ) -> tuple[Key, int, int | None] | None:
        """Key, start slot and the empty-count of the node to open (None: first node in order)."""
        ...

    def group(
        self, slots: geometry.Slots, sig: snapshot.Signature, gpus_per_member: int, members: int, node_gpus: int
    ) -> tuple[Key, tuple[int, ...] | None] | None:
        """Key and, per member in order, the empty-count of the node it takes (None: first fit in order).

        Return None when the domain cannot host the group.
        """
        ...


@runtime_checkable
class QueueAware(Protocol):
    """A policy that can use the shapes waiting in the queue (optional; the baselines ignore the queue)."""

    def observe_queue(self, waiting: Mapping[fragmentation.Shape, int]) -> None:
        """The number of requests of each shape now waiting, the request about to be placed excluded."""
        ...


@runtime_checkable
class Holding(Protocol):
    """A policy that may hold a MIG request rather than strand compute (``place`` refuses it with that reason).

    ``place`` lifts the hold for a gang that could never be placed without
    stranding, even on this cluster emptied, so holding never starves a request.
    """

    def without_hold(self) -> Policy:
        """The same policy, never holding."""
        ...


def observe_queue(policy: Policy, waiting: Mapping[fragmentation.Shape, int]) -> None:
    """Tell ``policy`` what is waiting, if it wants to know (a no-op for policies that ignore the queue).

    The caller (the operator's queue runner, or the benchmark for every policy
    alike) calls this before each ``place`` with the waiting requests' shapes
    (``fragmentation.shape_of``), the request being placed excluded.
    """
    if isinstance(policy, QueueAware):
        policy.observe_queue(waiting)


def group_fits(sig: snapshot.Signature, gpus_per_member: int, members: int) -> bool:
    """Whether nodes with empty counts ``sig`` can host ``members`` members of ``gpus_per_member`` GPUs."""
    return sum(c // gpus_per_member for c in sig) >= members


def take(sig: snapshot.Signature, count: int, gpus: int) -> snapshot.Signature:
    """``sig`` after taking ``gpus`` empty GPUs from a node that had ``count``."""
    out = list(sig)
    out.remove(count)
    out.append(count - gpus)
    out.sort()
    return tuple(out)
