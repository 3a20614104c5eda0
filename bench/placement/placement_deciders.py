"""The columns of the placement benchmark as decision makers: gpuplane's policies and the kube-scheduler model.

A baseline column is a :class:`policies.base.Policy` asked through ``place.place``; the
kube-scheduler columns (:mod:`bench.kube.kube_model`) are stateful :class:`Placer` objects that decide
themselves and hear every allocation and release, as the real scheduler's cache does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from bench.kube import kube_model
from bench.placement.placement_report import BASELINES
from bench.placement.trace import Topology
from gpuplane.placement import fragmentation, model, policies, snapshot


@runtime_checkable
class Placer(Protocol):
    """A stateful decision maker (the kube-scheduler model): decides itself and hears what is applied."""

    name: str

    def place(self, request: model.Request, snap: snapshot.Snapshot) -> model.Decision:
        """Where ``request`` goes, or a refusal."""
        ...

    def allocated(self, d: model.Decision) -> None:
        """``d`` was applied to the cluster."""
        ...

    def released(self, d: model.Decision) -> None:
        """``d``'s pods left."""
        ...


Decider = policies.base.Policy | Placer


def make_policy(name: str, mix: fragmentation.SizeMix, topo: Topology) -> Decider:
    """A fresh policy or placer by its column name."""
    if name in BASELINES:
        return policies.make(name, mix)
    return kube_model.variants(mix, _walks(topo.gpus_per_node))[name]


_WALKS: dict[int, Mapping[int, kube_model.WalkOrder]] = {}


def _walks(gpus_per_node: int) -> Mapping[int, kube_model.WalkOrder]:
    got = _WALKS.get(gpus_per_node)
    if got is None:
        got = kube_model.walks_for([gpus_per_node])
        _WALKS[gpus_per_node] = got
    return got
