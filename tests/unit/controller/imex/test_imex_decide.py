"""controller.imex.decide: IMEX domains as connected gangs within a clique, one stable channel per gang."""

from __future__ import annotations

from gpuplane.controller.imex.decide import PlacedGang, plan

RACK_A = {f"a{i}": "cluster-1.0" for i in range(18)}
RACK_B = {f"b{i}": "cluster-1.1" for i in range(18)}
CLIQUES = {**RACK_A, **RACK_B, "hgx-0": ""}


def gang(uid: str, *nodes: str, since: float = 0.0, channel: int | None = None) -> PlacedGang:
    return PlacedGang(uid=uid, key=f"ns/{uid}", since=since, nodes=nodes, cliques=CLIQUES, channel=channel)


def test_a_gang_inside_one_node_needs_no_imex() -> None:
    p = plan([gang("g1", "a0", "a0")])
    assert p.domains == () and p.channels == {} and p.refused == {}


def test_gangs_on_disjoint_nodes_get_domains_of_their_own() -> None:
    p = plan([gang("g1", "a0", "a1", since=1), gang("g2", "a2", "a3", since=2)])
    assert [(d.name, d.nodes, d.gangs) for d in p.domains] == [
        ("imex-g1", ("a0", "a1"), ("g1",)),
        ("imex-g2", ("a2", "a3"), ("g2",)),
    ]
    assert p.channels == {"g1": 1, "g2": 2}


def test_gangs_sharing_a_node_share_its_domain_named_after_the_oldest() -> None:
    p = plan([gang("young", "a1", "a2", since=5), gang("old", "a0", "a1", since=1)])
    (domain,) = p.domains
    assert domain.name == "imex-old" and domain.nodes == ("a0", "a1", "a2") and domain.gangs == ("old", "young")
    assert domain.clique == "cluster-1.0"
    assert p.channels["old"] != p.channels["young"]  # one node, two gangs: isolated by channel
    assert p.domain_of("young") is domain


def test_channels_are_stable_and_new_gangs_take_the_lowest_free() -> None:
    p = plan([gang("g1", "a0", "a1", channel=1), gang("g3", "a4", "a5", channel=3), gang("new", "a6", "a7", since=9)])
    assert p.channels == {"g1": 1, "g3": 3, "new": 2}


def test_domains_that_merge_keep_every_running_gangs_channel() -> None:
    before = plan([gang("a", "a0", "a1", since=1, channel=2), gang("b", "a2", "a3", since=2, channel=1)])
    assert len(before.domains) == 2
    bridge = gang("c", "a1", "a2", since=3)
    after = plan([gang("a", "a0", "a1", since=1, channel=2), gang("b", "a2", "a3", since=2, channel=1), bridge])
    (domain,) = after.domains
    assert domain.name == "imex-a" and domain.nodes == ("a0", "a1", "a2", "a3")
    assert after.channels == {"a": 2, "b": 1, "c": 3}


def test_a_duplicate_recorded_channel_goes_to_the_older_gang() -> None:
    p = plan([gang("late", "a2", "a3", since=2, channel=4), gang("early", "a0", "a1", since=1, channel=4)])
    assert p.channels == {"early": 4, "late": 1}


def test_channel_zero_and_out_of_range_records_are_never_kept() -> None:
    p = plan([gang("z", "a0", "a1", channel=0), gang("big", "a2", "a3", since=1, channel=5000)])
    assert p.channels == {"z": 1, "big": 2}


def test_cliques_count_channels_apart() -> None:
    p = plan([gang("x", "a0", "a1"), gang("y", "b0", "b1")])
    assert p.channels == {"x": 1, "y": 1}
    assert {d.clique for d in p.domains} == {"cluster-1.0", "cluster-1.1"}


def test_a_gang_across_cliques_or_without_one_is_refused_with_the_nodes_named() -> None:
    p = plan([gang("cross", "a0", "b0"), gang("hgx", "hgx-0", "a0", since=1)])
    assert p.domains == () and p.channels == {}
    assert "a0: cluster-1.0, b0: cluster-1.1" in p.refused["cross"]
    assert "hgx-0: no clique" in p.refused["hgx"]


def test_running_out_of_channels_refuses_the_youngest_with_why() -> None:
    p = plan([gang(f"g{i}", f"a{2 * i}", f"a{2 * i + 1}", since=i) for i in range(3)], channel_count=3)
    assert p.channels == {"g0": 1, "g1": 2}
    assert p.refused == {"g2": "gang ns/g2: all 2 IMEX channels of clique cluster-1.0 in use"}
    assert [d.gangs for d in p.domains] == [("g0",), ("g1",)]
