"""The immutable, indexed cluster snapshot that placement decides against.

A snapshot never changes: ``with_allocation`` and ``with_release`` return a new
one that shares every untouched domain, node and GPU with the old one. Two
small indexes make a decision independent of cluster size in the common case:

* ``by_state``: MIG occupancy state -> domains holding a GPU in that state (a
  cluster has a few dozen distinct states);
* ``by_signature``: domain signature (sorted empty-GPU counts of its nodes) ->
  domains with that signature.

Updating them copies only the two affected index entries, so applying a
decision costs O(touched GPUs + entries of the affected index sets).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType

from gpuplane.mig.geometry import HOPPER, MigGeometry
from gpuplane.placement import geometry, model

Signature = tuple[int, ...]


class Snapshot:
    """An immutable cluster view with free-capacity indexes; build with :meth:`build`."""

    __slots__ = (
        "_by_sig",
        "_by_state",
        "_domain_states",
        "_domains",
        "_slots",
        "_where",
        "max_domain_gpus",
        "max_node_gpus",
    )

    _domains: tuple[model.Domain, ...]
    _slots: geometry.Slots
    _domain_states: tuple[Mapping[int, int], ...]
    _by_state: Mapping[int, frozenset[int]]
    _by_sig: Mapping[Signature, frozenset[int]]
    _where: Mapping[str, tuple[int, int, int]]
    max_domain_gpus: int
    max_node_gpus: int

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Snapshot is immutable")

    @classmethod
    def build(cls, domains: Iterable[model.Domain], geo: MigGeometry = HOPPER) -> Snapshot:
        """Index ``domains`` (kept in the given order, which is the tie-break order)."""
        doms = tuple(domains)
        slots = geometry.slots_for(geo)
        where: dict[str, tuple[int, int, int]] = {}
        names: set[str] = set()
        for di, d in enumerate(doms):
            if d.name in names:
                raise ValueError(f"duplicate domain {d.name}")
            names.add(d.name)
            for ni, n in enumerate(d.nodes):
                if n.domain != d.name:
                    raise ValueError(f"node {n.name} says domain {n.domain}, listed under {d.name}")
                for gi, g in enumerate(n.gpus):
                    if g.id in where:
                        raise ValueError(f"duplicate GPU id {g.id}")
                    where[g.id] = (di, ni, gi)
        states = tuple(_state_counts(slots, d) for d in doms)
        by_state: dict[int, set[int]] = {}
        by_sig: dict[Signature, set[int]] = {}
        for di, d in enumerate(doms):
            for s in states[di]:
                by_state.setdefault(s, set()).add(di)
            by_sig.setdefault(d.signature, set()).add(di)
        return cls._make(
            domains=doms,
            slots=slots,
            domain_states=states,
            by_state={k: frozenset(v) for k, v in by_state.items()},
            by_sig={k: frozenset(v) for k, v in by_sig.items()},
            where=MappingProxyType(where),
            max_domain_gpus=max((d.gpu_count for d in doms), default=0),
            max_node_gpus=max((len(n.gpus) for d in doms for n in d.nodes), default=0),
        )

    @classmethod
    def _make(
        cls,
        *,
        domains: tuple[model.Domain, ...],
        slots: geometry.Slots,
        domain_states: tuple[Mapping[int, int], ...],
        by_state: Mapping[int, frozenset[int]],
        by_sig: Mapping[Signature, frozenset[int]],
        where: Mapping[str, tuple[int, int, int]],
        max_domain_gpus: int,
        max_node_gpus: int,
    ) -> Snapshot:
        snap = object.__new__(cls)
        for k, v in (
            ("_domains", domains),
            ("_slots", slots),
            ("_domain_states", domain_states),
            ("_by_state", by_state),
            ("_by_sig", by_sig),
            ("_where", where),
            ("max_domain_gpus", max_domain_gpus),
            ("max_node_gpus", max_node_gpus),
        ):
            object.__setattr__(snap, k, v)
        return snap

    # --- read access -------------------------------------------------------

    @property
    def domains(self) -> tuple[model.Domain, ...]:
        """Domains in tie-break order."""
        return self._domains

    @property
    def slots(self) -> geometry.Slots:
        """MIG slot arithmetic for this cluster's geometry."""
        return self._slots

    @property
    def by_state(self) -> Mapping[int, frozenset[int]]:
        """MIG state -> indices of domains holding a GPU in that state."""
        return self._by_state

    def state_counts(self, domain_index: int) -> Mapping[int, int]:
        """MIG state -> number of GPUs in that state in one domain (whole and empty GPUs excluded)."""
        return self._domain_states[domain_index]

    @property
    def by_signature(self) -> Mapping[Signature, frozenset[int]]:
        """Domain signature -> indices of domains with that signature."""
        return self._by_sig

    def locate(self, gpu_id: str) -> tuple[int, int, int]:
        """(domain, node, gpu) indices of a GPU id; KeyError if unknown."""
        return self._where[gpu_id]

    def gpu(self, gpu_id: str) -> model.Gpu:
        """The GPU called ``gpu_id``."""
        d, n, g = self._where[gpu_id]
        return self._domains[d].nodes[n].gpus[g]

    def state(self, gpu: model.Gpu) -> int:
        """The occupancy state of ``gpu``."""
        return self._slots.state_of(gpu.whole, gpu.mig)

    def gpus(self) -> Iterator[model.Gpu]:
        """Every GPU in domain, node, GPU order."""
        for d in self._domains:
            for n in d.nodes:
                yield from n.gpus

    def gpu_total(self) -> int:
        """Number of GPUs."""
        return len(self._where)

    # --- new versions ------------------------------------------------------

    def with_allocation(self, decision: model.Decision) -> Snapshot:
        """A snapshot with ``decision``'s GPUs and MIG instances taken; ValueError on any conflict."""
        return self._with(decision, allocate=True)

    def with_release(self, decision: model.Decision) -> Snapshot:
        """A snapshot with ``decision``'s GPUs and MIG instances freed; ValueError if not allocated."""
        return self._with(decision, allocate=False)

    def _with(self, decision: model.Decision, allocate: bool) -> Snapshot:
        changed: dict[str, model.Gpu] = {}
        slots = self._slots

        def current(gid: str) -> model.Gpu:
            got = changed.get(gid)
            return got if got is not None else self.gpu(gid)

        for m in decision.members:
            for gid in m.gpus:
                g = current(gid)
                if allocate and not g.empty:
                    raise ValueError(f"GPU {gid} is not free")
                if not allocate and not g.whole:
                    raise ValueError(f"GPU {gid} is not allocated whole")
                changed[gid] = _replace_gpu(g, whole=allocate, mig=g.mig)
            for ms in m.mig:
                g = current(ms.gpu)
                st = slots.state_of(g.whole, g.mig)
                inst = model.MigInstance(ms.profile, ms.start)
                if allocate:
                    slots.add(st, ms.profile, ms.start)  # raises on overlap
                    mig = tuple(sorted((*g.mig, inst), key=lambda i: (i.start, i.profile)))
                else:
                    if inst not in g.mig:
                        raise ValueError(f"MIG {ms.profile}@{ms.start} on {ms.gpu} is not allocated")
                    mig = tuple(i for i in g.mig if i != inst)
                changed[ms.gpu] = _replace_gpu(g, whole=False, mig=mig)
        return self._apply(changed)

    def _apply(self, changed: Mapping[str, model.Gpu]) -> Snapshot:
        if not changed:
            return self
        per_domain: dict[int, dict[int, dict[int, model.Gpu]]] = {}
        for gid, g in changed.items():
            d, n, i = self._where[gid]
            per_domain.setdefault(d, {}).setdefault(n, {})[i] = g
        domains = list(self._domains)
        dstates = list(self._domain_states)
        by_state = dict(self._by_state)
        by_sig = dict(self._by_sig)
        for di in sorted(per_domain):
            old = domains[di]
            nodes = list(old.nodes)
            counts = dict(dstates[di])
            for ni, gpus in per_domain[di].items():
                node = nodes[ni]
                glist = list(node.gpus)
                for gi, g in gpus.items():
                    _count(self._slots, counts, glist[gi], -1)
                    _count(self._slots, counts, g, +1)
                    glist[gi] = g
                nodes[ni] = model.Node(name=node.name, domain=node.domain, gpus=tuple(glist))
            new = model.Domain(name=old.name, nodes=tuple(nodes))
            domains[di] = new
            old_states = dstates[di]
            dstates[di] = counts
            for s in old_states.keys() - counts.keys():
                left = by_state[s] - {di}
                if left:
                    by_state[s] = left
                else:
                    del by_state[s]
            for s in counts.keys() - old_states.keys():
                by_state[s] = by_state.get(s, frozenset()) | {di}
            if new.signature != old.signature:
                left = by_sig[old.signature] - {di}
                if left:
                    by_sig[old.signature] = left
                else:
                    del by_sig[old.signature]
                by_sig[new.signature] = by_sig.get(new.signature, frozenset()) | {di}
        return Snapshot._make(
            domains=tuple(domains),
            slots=self._slots,
            domain_states=tuple(dstates),
            by_state=by_state,
            by_sig=by_sig,
            where=self._where,
            max_domain_gpus=self.max_domain_gpus,
            max_node_gpus=self.max_node_gpus,
        )


def _replace_gpu(g: model.Gpu, whole: bool, mig: tuple[model.MigInstance, ...]) -> model.Gpu:
    return model.Gpu(
        id=g.id, node=g.node, domain=g.domain, model=g.model, whole=whole, mig=mig, memory_gib=g.memory_gib
    )


def _count(slots: geometry.Slots, counts: dict[int, int], g: model.Gpu, delta: int) -> None:
    """Adjust ``counts`` for a GPU holding MIG instances."""
    if g.whole or not g.mig:
        return
    s = slots.state_of(False, g.mig)
    c = counts.get(s, 0) + delta
    if c:
        counts[s] = c
    else:
        del counts[s]


def _state_counts(slots: geometry.Slots, d: model.Domain) -> dict[int, int]:
    """Counts of GPUs holding MIG instances, by state (full ones included)."""
    out: dict[int, int] = {}
    for n in d.nodes:
        for g in n.gpus:
            _count(slots, out, g, +1)
    return out


def uniform_cluster(
    domains: int,
    nodes_per_domain: int,
    gpus_per_node: int,
    *,
    gpu_model: str = "H100",
    prefix: str = "",
    geo: MigGeometry = HOPPER,
) -> Snapshot:
    """An empty cluster of equal domains: HGX is (n, 1, 8), NVL72 is (n, 18, 4).

    Names: domain ``{prefix}d{i}``, node ``{prefix}d{i}-n{j}``, GPU ``{node}-g{k}``.
    """
    doms = []
    for i in range(domains):
        dname = f"{prefix}d{i}"
        nodes = []
        for j in range(nodes_per_domain):
            nname = f"{dname}-n{j}"
            gpus = tuple(
                model.Gpu(id=f"{nname}-g{k}", node=nname, domain=dname, model=gpu_model) for k in range(gpus_per_node)
            )
            nodes.append(model.Node(name=nname, domain=dname, gpus=gpus))
        doms.append(model.Domain(name=dname, nodes=tuple(nodes)))
    return Snapshot.build(doms, geo)
