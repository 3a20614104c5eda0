"""Property tests of place() over generated clusters and request streams, for every policy.

Invariants: no TP group crosses an NVLink domain; no GPU or MIG slot is given
twice; gangs are all or nothing; refusals carry reasons; same input, same
decision; the snapshot's incremental indexes equal a fresh rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplane.placement import fragmentation, model, place, policies, snapshot

PROFILES = ("1g", "1g.2m", "2g", "3g", "4g", "7g", "1g+me")


@dataclass(frozen=True)
class Cluster:
    domains: int
    nodes: int
    gpus: int


clusters = st.builds(
    Cluster,
    domains=st.integers(1, 4),
    nodes=st.integers(1, 4),
    gpus=st.sampled_from((1, 2, 4, 8)),
)


@st.composite
def requests(draw: st.DrawFn, idx: int) -> model.Request:
    rid = f"r{idx}"
    if draw(st.booleans()):
        return model.Request(id=rid, mig_profile=draw(st.sampled_from(PROFILES)), members=draw(st.integers(1, 3)))
    g = draw(st.sampled_from((1, 2, 4, 8)))
    members = draw(st.integers(1, 4))
    # tp_size: within a member (divides g) or spanning whole members
    mpg = draw(st.sampled_from([m for m in (1, 2, 4) if members % m == 0]))
    tp = g * mpg if mpg > 1 else draw(st.sampled_from([t for t in (1, 2, 4, 8) if g % t == 0]))
    return model.Request(id=rid, gpus_per_member=g, members=members, tp_size=tp, priority=draw(st.integers(0, 3)))


@st.composite
def streams(draw: st.DrawFn) -> list[tuple[model.Request, bool]]:
    n = draw(st.integers(1, 25))
    return [(draw(requests(i)), draw(st.booleans())) for i in range(n)]


def build(c: Cluster) -> snapshot.Snapshot:
    return snapshot.uniform_cluster(c.domains, c.nodes, c.gpus)


def check_decision(r: model.Request, d: model.Decision, snap: snapshot.Snapshot) -> None:
    if not d.placed:
        assert d.reason, "a refusal must carry a reason"
        assert d.members == ()
        return
    assert d.reason == ""
    assert sorted(m.member for m in d.members) == list(range(r.members)), "all or nothing"
    mpg = r.members_per_group
    groups: dict[int, set[str]] = {}
    seen_gpus: set[str] = set()
    for m in d.members:
        groups.setdefault(m.member // mpg, set()).add(m.domain)
        if r.mig_profile is None:
            assert len(m.gpus) == r.gpus_per_member and not m.mig
            for gid in m.gpus:
                g = snap.gpu(gid)
                assert g.node == m.node and g.domain == m.domain
                assert g.empty, f"{gid} was not free"
                assert gid not in seen_gpus, f"{gid} given twice"
                seen_gpus.add(gid)
        else:
            assert len(m.mig) == 1 and not m.gpus
            assert m.mig[0].profile == r.mig_profile
            assert snap.gpu(m.mig[0].gpu).node == m.node
    for doms in groups.values():
        assert len(doms) == 1, "a TP group crossed an NVLink domain"


def same_indexes(a: snapshot.Snapshot) -> None:
    fresh = snapshot.Snapshot.build(a.domains)
    assert dict(fresh.by_state) == dict(a.by_state)
    assert dict(fresh.by_signature) == dict(a.by_signature)
    for i in range(len(a.domains)):
        assert dict(fresh.state_counts(i)) == dict(a.state_counts(i))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=clusters, stream=streams(), pname=st.sampled_from(policies.NAMES))
def test_stream_invariants(c: Cluster, stream: list[tuple[model.Request, bool]], pname: str) -> None:
    snap = build(c)
    pol = policies.make(pname)
    live: list[model.Decision] = []
    for r, release_first in stream:
        if release_first and live:
            snap = snap.with_release(live.pop(0))
        before = snap
        d = place.place(r, snap, pol)
        check_decision(r, d, snap)
        assert place.place(r, snap, policies.make(pname)) == d, "same input, same decision"
        assert snap is before  # place never mutates
        if d.placed:
            snap = snap.with_allocation(d)  # raises on any overlap
            live.append(d)
    same_indexes(snap)
    # releasing everything gives back an empty cluster
    for d in live:
        snap = snap.with_release(d)
    assert all(g.empty for g in snap.gpus())
    assert dict(snap.by_state) == {}


@settings(max_examples=30, deadline=None)
@given(c=clusters, extra=st.integers(1, 64))
def test_tp_larger_than_any_domain_is_refused_with_numbers(c: Cluster, extra: int) -> None:
    snap = build(c)
    size = c.nodes * c.gpus
    tp = size + extra
    g = min(c.gpus, tp)
    while tp % g:
        tp += 1
    r = model.Request(id="big", gpus_per_member=g, members=tp // g, tp_size=tp)
    d = place.place(r, snap, policies.make("gpuplane"))
    assert not d.placed
    assert f"TP size {tp} exceeds the largest NVLink domain ({size} GPUs)" in d.reason


@settings(max_examples=30, deadline=None)
@given(c=clusters, stream=streams())
def test_gang_refusal_leaves_nothing_behind(c: Cluster, stream: list[tuple[model.Request, bool]]) -> None:
    """Fill the cluster, then a gang that cannot fit entirely is refused; placing the rest is unaffected."""
    snap = build(c)
    pol = policies.make("best-fit")
    for r, _ in stream:
        d = place.place(r, snap, pol)
        if d.placed:
            snap = snap.with_allocation(d)
    free = sum(1 for g in snap.gpus() if g.empty)
    r = model.Request(id="gang", gpus_per_member=1, members=free + 1)
    d = place.place(r, snap, pol)
    assert not d.placed and d.reason and d.members == ()


def test_fragmentation_of_empty_cluster_is_zero() -> None:
    snap = snapshot.uniform_cluster(2, 2, 4)
    mix = fragmentation.SizeMix.from_requests(
        [model.Request(id="a", mig_profile="3g"), model.Request(id="b", gpus_per_member=4, tp_size=4)]
    )
    assert fragmentation.Fragmentation(mix, snap.slots).of(snap) == 0.0
