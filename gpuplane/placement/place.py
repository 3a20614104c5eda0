"""``place(request, snapshot, policy) -> Decision``: gangs all or nothing, TP groups inside one domain.

The rule that no policy can bend: a tensor-parallel group never spans NVLink
domains. A request whose TP size exceeds the largest domain is refused with
both numbers in the reason. Members are placed group by group on a working
snapshot; if any group finds no room the whole gang is refused and nothing is
returned but the reason (the input snapshot is immutable, so nothing leaks).

Candidates come from the snapshot's indexes, one class per MIG state or domain
signature (see ``policies.base``), so a decision costs O(distinct classes) plus
one scan of the chosen domain, not O(GPUs).
"""

from __future__ import annotations

from gpuplane.placement import fragmentation, geometry, model, snapshot
from gpuplane.placement.policies import base


def place(request: model.Request, snap: snapshot.Snapshot, policy: base.Policy) -> model.Decision:
    """Decide where every member of ``request`` goes, or refuse with a reason."""
    reason = check(request, snap)
    if reason:
        return model.Decision.refused(request.id, reason)
    if request.mig_profile is not None:
        return _place_mig(request, request.mig_profile, snap, policy)
    return _place_whole(request, snap, policy)


def check(request: model.Request, snap: snapshot.Snapshot) -> str:
    """Reasons a request can never fit this cluster, whatever is free ('' when it could)."""
    if request.mig_profile is not None:
        if not snap.slots.geometry.has_profile(request.mig_profile):
            return f"unknown MIG profile {request.mig_profile!r} for geometry {snap.slots.geometry.name}"
        return ""
    if request.tp_size > snap.max_domain_gpus:
        return (
            f"TP size {request.tp_size} exceeds the largest NVLink domain ({snap.max_domain_gpus} GPUs):"
            " a tensor-parallel group never spans domains"
        )
    if request.gpus_per_member > snap.max_node_gpus:
        return f"{request.gpus_per_member} GPUs per member exceed the largest node ({snap.max_node_gpus} GPUs)"
    if request.total_gpus > snap.gpu_total():
        return f"the gang needs {request.total_gpus} GPUs; the cluster has {snap.gpu_total()}"
    return ""


def _place_mig(request: model.Request, profile: str, snap: snapshot.Snapshot, policy: base.Policy) -> model.Decision:
    if isinstance(policy, base.Holding) and request.members > snap.slots.clean_fit(profile) * snap.gpu_total():
        # Even the emptied cluster could not take this gang without stranding compute: holding would starve it.
        policy = policy.without_hold()
    work = snap
    out: list[model.MemberPlacement] = []
    for m in range(request.members):
        choice = _choose_mig(work, profile, policy)
        if choice is None:
            return model.Decision.refused(request.id, _no_mig_room(request, profile, work, m, policy))
        di, ni, gi, start = choice
        dom = work.domains[di]
        node = dom.nodes[ni]
        mp = model.MemberPlacement(
            member=m,
            node=node.name,
            domain=dom.name,
            mig=(model.MigSlot(gpu=node.gpus[gi].id, profile=profile, start=start),),
        )
        out.append(mp)
        if m + 1 < request.members:
            work = work.with_allocation(model.Decision(request.id, (mp,)))
    return model.Decision(request.id, tuple(out))


_Cand = tuple[bool, int, "snapshot.Signature", int, "int | None", frozenset[int]]


def _choose_mig(snap: snapshot.Snapshot, profile: str, policy: base.Policy) -> tuple[int, int, int, int] | None:
    """(domain, node, gpu, start) of the best MIG placement, or None."""
    slots = snap.slots
    ng = snap.max_node_gpus
    best: base.Key | None = None
    tied: list[_Cand] = []
    for st, doms in snap.by_state.items():
        if not slots.can_host(st, profile):
            continue
        r = policy.mig_partial(slots, st, profile)
        if r is None:
            continue
        if best is None or r[0] < best:
            best, tied = r[0], [(True, st, (), r[1], None, doms)]
        elif r[0] == best:
            tied.append((True, st, (), r[1], None, doms))
    for sig, doms in snap.by_signature.items():
        if not sig or sig[-1] == 0:
            continue
        e = policy.mig_empty(slots, profile, sig, ng)
        if e is None:
            continue
        if best is None or e[0] < best:
            best, tied = e[0], [(False, 0, sig, e[1], e[2], doms)]
        elif e[0] == best:
            tied.append((False, 0, sig, e[1], e[2], doms))
    pick: tuple[int, int, int, int] | None = None
    for partial, st, _sig, start, count, doms in tied:
        di = min(doms)
        pos = _first_partial(snap, slots, di, st) if partial else _first_empty(snap, di, count)
        cand = (di, pos[0], pos[1], start)
        if pick is None or cand < pick:
            pick = cand
    return pick


def _no_mig_room(
    request: model.Request, profile: str, snap: snapshot.Snapshot, member: int, policy: base.Policy
) -> str:
    where = f"(member {member + 1} of {request.members}); gang not placed"
    slots = snap.slots
    room = any(slots.can_host(st, profile) for st in snap.by_state) or any(
        sig and sig[-1] > 0 for sig in snap.by_signature
    )
    if not room:
        return f"no GPU has a free {profile} placement {where}"
    return (
        f"policy {policy.name} holds the request: every free {profile} placement would strand compute slices"
        f" that no later MIG instance could use; it waits for one that strands none {where}"
    )


def _first_partial(snap: snapshot.Snapshot, slots: geometry.Slots, di: int, state: int) -> tuple[int, int]:
    for ni, node in enumerate(snap.domains[di].nodes):
        for gi, g in enumerate(node.gpus):
            if g.mig and not g.whole and slots.state_of(False, g.mig) == state:
                return ni, gi
    raise AssertionError(f"index says domain {di} holds state {state:#x}")


def _first_empty(snap: snapshot.Snapshot, di: int, count: int | None) -> tuple[int, int]:
    for ni, node in enumerate(snap.domains[di].nodes):
        if node.free_whole and (count is None or node.free_whole == count):
            for gi, g in enumerate(node.gpus):
                if g.empty:
                    return ni, gi
    raise AssertionError(f"index says domain {di} has a node with {count} empty GPUs")


def _place_whole(request: model.Request, snap: snapshot.Snapshot, policy: base.Policy) -> model.Decision:
    g = request.gpus_per_member
    mpg = request.members_per_group
    work = snap
    out: list[model.MemberPlacement] = []
    for grp in range(request.members // mpg):
        choice = _choose_group(work, g, mpg, policy)
        if choice is None:
            return model.Decision.refused(request.id, _no_room(request, work, grp))
        di, picks = choice
        dom = work.domains[di]
        members = tuple(
            model.MemberPlacement(
                member=grp * mpg + i,
                node=dom.nodes[ni].name,
                domain=dom.name,
                gpus=tuple(dom.nodes[ni].gpus[k].id for k in gis),
            )
            for i, (ni, gis) in enumerate(picks)
        )
        out.extend(members)
        if (grp + 1) * mpg < request.members:
            work = work.with_allocation(model.Decision(request.id, members))
    return model.Decision(request.id, tuple(out))


def _choose_group(
    snap: snapshot.Snapshot, g: int, mpg: int, policy: base.Policy
) -> tuple[int, list[tuple[int, tuple[int, ...]]]] | None:
    """(domain, [(node, gpu indices)] per member) for one TP group, or None."""
    ng = snap.max_node_gpus
    best: base.Key | None = None
    tied: list[tuple[tuple[int, ...] | None, frozenset[int]]] = []
    for sig, doms in snap.by_signature.items():
        if not sig or sig[-1] == 0:
            continue
        r = policy.group(snap.slots, sig, g, mpg, ng)
        if r is None:
            continue
        if best is None or r[0] < best:
            best, tied = r[0], [(r[1], doms)]
        elif r[0] == best:
            tied.append((r[1], doms))
    if not tied:
        return None
    di, counts = min((min(doms), counts) for counts, doms in tied)
    nodes = snap.domains[di].nodes
    free = [n.free_whole for n in nodes]
    used: list[set[int]] = [set() for _ in nodes]
    picks: list[tuple[int, tuple[int, ...]]] = []
    for i in range(mpg):
        want = None if counts is None else counts[i]
        ni = next(j for j, f in enumerate(free) if (f >= g if want is None else f == want))
        gis = tuple(k for k, gp in enumerate(nodes[ni].gpus) if gp.empty and k not in used[ni])[:g]
        used[ni].update(gis)
        free[ni] -= g
        picks.append((ni, gis))
    return di, picks


def _no_room(request: model.Request, snap: snapshot.Snapshot, group: int) -> str:
    ng = snap.max_node_gpus
    block = max((fragmentation.largest_block(sig, ng) for sig in snap.by_signature), default=0)
    mpg = request.members_per_group
    what = (
        f"a TP group of {request.tp_size} GPUs ({mpg} member(s) x {request.gpus_per_member} GPUs)"
        if request.tp_size > 1
        else f"a member of {request.gpus_per_member} whole GPU(s)"
    )
    return (
        f"no NVLink domain has room for {what}, group {group + 1} of {request.members // mpg};"
        f" the largest free block is {block} GPUs; gang not placed"
    )
