"""IMEX groups (claims labelled ``gpuplane.dev/imex-group``, no gang): the label's validation, the controller's
grouping and caps, the plan with groups and gangs mixed, the Events on refused claims, and the driver's bounded
wait for a labelled claim (through the real prepare on a simulated gb200 tray, with an injected clock)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from gpuplane.api import imex, imex_group, kubetime
from gpuplane.api import names as dn
from gpuplane.controller import events, indexed, names
from gpuplane.controller.gang import world
from gpuplane.controller.imex import decide, groups, reconcile
from gpuplane.driver import config
from gpuplane.driver.prepare import imex_claims
from testing import driverkit
from tests.controllerkit import gang_index

CLIQUE = "cluster-1.0"
TRAYS = [f"tray-{i}" for i in range(4)]
GPU_DOMAINS = {f"{n}/gpu-{g}": CLIQUE for n in TRAYS for g in range(4)} | {"hgx-0/gpu-0": "hgx-0.nvl0"}
CLIQUES = {n: CLIQUE for n in TRAYS} | {"hgx-0": "hgx-0.nvl0"}


def claim(
    name: str,
    node: str | None,
    group: str | None = "train",
    ns: str = "team",
    created: str = "2026-01-01T00:00:00Z",
    **meta: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if node is not None:
        results = [{"driver": dn.DRIVER_NAME, "request": "gpus", "pool": node, "device": "gpu-0"}]
        status["allocation"] = {"devices": {"results": results}}
    labels = {} if group is None else {imex_group.LABEL: group}
    metadata = {"name": name, "namespace": ns, "uid": f"cuid-{ns}-{name}", "creationTimestamp": created}
    return {"metadata": {**metadata, "labels": labels, **meta}, "status": status}


def make_world(
    claims: Sequence[Mapping[str, Any]], gangs: Mapping[str, Mapping[str, Any]] | None = None
) -> world.World:
    by_key = {f"{c['metadata']['namespace']}/{c['metadata']['name']}": indexed.claim(c) for c in claims}
    return world.World(
        gangs=gang_index((gangs or {}).values()), pods={}, claims=by_key, slices=(), nodes={}, classes={}
    )


# ---------------------------------------------------------------- the label


def test_the_group_name_is_a_dns_label_and_anything_else_is_refused_with_why() -> None:
    assert imex_group.group_of(claim("a", "tray-0", "train-1")) == ("train-1", "")
    assert imex_group.group_of(claim("a", "tray-0", None)) == ("", "")
    for bad in ("Train", "a_b", "a.b", "-a", "a-", "", "x" * 64):
        name, why = imex_group.group_of(claim("a", "tray-0", bad))
        assert name == "" and imex_group.LABEL in why, bad
    assert (
        imex_group.group_of({"metadata": {"labels": {imex_group.LABEL: 3}}})[1]
        == f"label {imex_group.LABEL} must be a string"
    )
    assert imex_group.group_of({"metadata": "garbage"}) == ("", "")


def test_the_gang_marks_are_the_controllers() -> None:
    assert (imex_group.GANG_LABEL, imex_group.GANG_KIND) == (names.LABEL_GANG, names.GANG_KIND)


def test_a_groups_uid_is_stable_per_namespace_and_name_and_never_a_gangs() -> None:
    uid = imex_group.group_uid("team", "train")
    assert uid == imex_group.group_uid("team", "train") and imex_group.is_group(uid)
    assert uid != imex_group.group_uid("other", "train") != imex_group.group_uid("team", "train2")
    assert len(uid) <= imex.MAX_UID and not imex_group.is_group("0d3c8a1e-1b2c-4d5e-8f90-123456789abc")


# ---------------------------------------------------------------- the controller's grouping


def test_claims_of_one_group_across_two_trays_become_one_entry_on_both_nodes() -> None:
    out = groups.gather(make_world([claim("a", "tray-0"), claim("b", "tray-1")]), CLIQUES, {})
    (g,) = out.gangs
    assert (g.kind, g.key, g.nodes, g.channel) == ("IMEX group", "team/train", ("tray-0", "tray-1"), None)
    assert g.uid == imex_group.group_uid("team", "train")
    assert sorted((c.name, c.node) for c in out.members[g.uid].claims) == [("a", "tray-0"), ("b", "tray-1")]
    assert out.refusals == ()


def test_another_namespaces_claims_with_the_same_name_are_another_group() -> None:
    w = make_world([claim("a", "tray-0"), claim("b", "tray-1", ns="evil"), claim("c", "tray-2", ns="evil")])
    out = groups.gather(w, CLIQUES, {})
    assert sorted((g.key, g.nodes) for g in out.gangs) == [
        ("evil/train", ("tray-1", "tray-2")),
        ("team/train", ("tray-0",)),
    ]
    assert {c.namespace for m in out.members.values() for c in m.claims if m.namespace == "team"} == {"team"}


def test_unallocated_deleting_gang_and_unlabelled_claims_are_not_a_groups() -> None:
    gang_body = {"metadata": {"name": "g", "namespace": "team", "uid": "u-g"}, "spec": {"members": 1}}
    w = make_world(
        [
            claim("pending", None),
            claim("going", "tray-1", deletionTimestamp="2026-01-01T00:01:00Z"),
            claim("member", "tray-1", labels={imex_group.LABEL: "train", names.LABEL_GANG: "g"}),
            claim("owned", "tray-1", ownerReferences=[{"kind": names.GANG_KIND, "name": "g", "uid": "u-g"}]),
            claim("templated", "tray-2"),
            claim("plain", "tray-3", None),
            claim("a", "tray-0"),
        ],
        {"team/g": gang_body},
    )
    out = groups.gather(w, CLIQUES, {}, gang_claims=lambda: ["team/templated"])
    (g,) = out.gangs
    assert [c.name for c in out.members[g.uid].claims] == ["a"] and g.nodes == ("tray-0",)


def test_a_bad_name_is_an_event_on_the_claim_and_changes_nothing() -> None:
    out = groups.gather(make_world([claim("a", "tray-0", "Bad_Name"), claim("b", "tray-1", "Bad_Name")]), CLIQUES, {})
    assert out.gangs == ()
    assert [(r.name, r.reason) for r in out.refusals] == [("a", "ImexGroupInvalid"), ("b", "ImexGroupInvalid")]
    assert "'Bad_Name' is not a DNS label" in out.refusals[0].message


def test_a_namespace_past_its_cap_is_refused_and_groups_holding_a_channel_keep_it() -> None:
    claims = []
    for i in range(4):  # g0 is the youngest but already holds a channel
        claims += [claim(f"g{i}-a", "tray-0", f"g{i}", created=f"2026-01-01T00:0{9 - i}:00Z")]
        claims += [claim(f"g{i}-b", "tray-1", f"g{i}", created=f"2026-01-01T00:0{9 - i}:00Z")]
    claims.append(claim("solo", "tray-2", "alone"))  # one node: needs no channel, not counted
    out = groups.gather(make_world(claims), CLIQUES, {imex_group.group_uid("team", "g0"): 7}, max_per_namespace=2)
    assert sorted(g.key for g in out.gangs) == ["team/alone", "team/g0", "team/g3"]
    refused = sorted((r.name, r.reason) for r in out.refusals)
    assert refused == [(f"g{i}-{s}", "ImexGroupRefused") for i in (1, 2) for s in "ab"]
    assert "already has 2 IMEX groups across nodes" in out.refusals[0].message


def test_a_group_past_the_claim_bound_is_refused() -> None:
    claims = [claim(f"c{i}", TRAYS[i % 2]) for i in range(groups.MAX_CLAIMS + 1)]
    out = groups.gather(make_world(claims), CLIQUES, {})
    assert out.gangs == () and len(out.refusals) == groups.MAX_CLAIMS + 1
    assert f"at most {groups.MAX_CLAIMS}" in out.refusals[0].message


# ---------------------------------------------------------------- the plan, gangs and groups mixed


def entry(uid: str, *nodes: str, kind: str = "gang", since: float = 0.0, channel: int | None = None) -> Any:
    return decide.PlacedGang(uid, f"ns/{uid}", since, nodes, CLIQUES, channel, kind)


def test_groups_and_gangs_share_domains_by_node_with_distinct_channels_and_gangs_first() -> None:
    p = decide.plan(
        [
            entry("grp", "tray-0", "tray-1", kind=groups.KIND, since=1),
            entry("gang", "tray-1", "tray-2", since=2),
            entry("far", "tray-3", "tray-3", kind=groups.KIND),
        ]
    )
    (d,) = p.domains
    assert d.nodes == ("tray-0", "tray-1", "tray-2") and d.gangs == ("grp", "gang") and d.name == "imex-grp"
    assert p.channels == {"gang": 1, "grp": 2}  # a new gang's channel comes before a new group's


def test_a_full_domain_loses_its_youngest_groups_never_a_gang() -> None:
    placed = [entry(f"gang{i}", "tray-0", "tray-1", since=i) for i in range(3)]
    placed += [entry(f"grp{i}", "tray-1", "tray-2", kind=groups.KIND, since=10 + i) for i in range(3)]
    p = decide.plan(placed, max_entries=4)
    (d,) = p.domains
    assert d.gangs == ("gang0", "gang1", "gang2", "grp0")
    assert sorted(p.refused) == ["grp1", "grp2"] and "already lists 4 gangs and groups" in p.refused["grp1"]
    assert set(p.channels) == {"gang0", "gang1", "gang2", "grp0"}


def test_a_group_across_cliques_is_refused_by_its_kind() -> None:
    p = decide.plan([entry("grp", "tray-0", "hgx-0", kind=groups.KIND)])
    assert p.domains == () and p.refused["grp"].startswith("IMEX group ns/grp spans nodes of different")


def test_the_pass_writes_a_domain_listing_the_groups_claims_and_tears_it_down_when_they_go() -> None:
    w = make_world(
        [claim("a", "tray-0"), claim("b", "tray-1"), claim("x", "tray-0", "other"), claim("y", "tray-1", "other")]
    )
    out = reconcile.desired(w, GPU_DOMAINS, [])
    (obj,) = out.diff.create
    model, why = imex.parse_domain(obj)
    assert why == "" and model is not None and model.nodes == ("tray-0", "tray-1")
    by_name = {g.name: g for g in model.gangs}
    assert {c.name for c in by_name["train"].claims} == {"a", "b"} and {c.name for c in by_name["other"].claims} == {
        "x",
        "y",
    }
    assert by_name["train"].channel != by_name["other"].channel
    plan = imex.claims_on([model], "tray-0")
    assert plan.claims["cuid-team-a"].channel == by_name["train"].channel
    assert reconcile.desired(w, GPU_DOMAINS, [obj]).diff == reconcile.desired(w, GPU_DOMAINS, [obj]).diff
    again = reconcile.desired(w, GPU_DOMAINS, [obj])
    assert again.diff.create == again.diff.update == () == again.diff.delete  # stable channels
    gone = reconcile.desired(make_world([claim("a", "tray-0")]), GPU_DOMAINS, [obj])
    assert gone.diff.delete == (obj["metadata"]["name"],)


class _Rt:
    def __init__(self) -> None:
        self.writer = None


def test_refused_claims_are_told_once_while_refused_and_again_after() -> None:
    recorder = events.ListRecorder([])
    one = reconcile.Pass(_Rt(), lambda: make_world([]), None, recorder)  # type: ignore[arg-type]
    w = make_world([claim("a", "tray-0", "BAD")])
    refusals = reconcile.desired(w, GPU_DOMAINS, []).claim_events
    one.tell_claims(refusals)
    one.tell_claims(refusals)
    assert [(n, t, r) for n, t, r, _ in recorder.events] == [("a", "Warning", "ImexGroupInvalid")]
    one.tell_claims(())
    one.tell_claims(refusals)
    assert len(recorder.events) == 2


# ---------------------------------------------------------------- the driver's wait

NODE, PEER = "tray-0", "tray-1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def drv() -> Iterator[tuple[driverkit.DriverUnderTest, list[Any], Clock, list[tuple[str, str]]]]:
    objects: list[Any] = []
    clock = Clock()
    told: list[tuple[str, str]] = []
    with driverkit.driver_env("gb200-nvl72", NODE, prefix="imxg") as d:
        settings = imex_claims.Settings(
            node=NODE,
            dev_dir=d.sim.device_node_dir(),
            proc_devices=d.sim.proc_devices,
            placeholder_ok=True,
            group_wait_s=120.0,
        )
        d.state.imex = imex_claims.Gate(
            lambda: copy.deepcopy(objects), settings, lambda c, why: told.append((c["metadata"]["name"], why)), clock
        )
        yield d, objects, clock, told


def prepare(
    d: driverkit.DriverUnderTest, name: str, uid: str, group: str | None = "train", device: str = "gpu-0"
) -> tuple[str, dict[str, Any]]:
    labels = {imex_group.LABEL: group} if group is not None else None
    return driverkit.prepare_cdi(d, name, NODE, uid, device, labels=labels)


def group_domain(uid: str, channel: int = 5) -> dict[str, Any]:
    claims = [{"namespace": "team", "name": "a", "uid": uid, "node": NODE}]
    claims.append({"namespace": "team", "name": "b", "uid": "u-peer", "node": PEER})
    gang = {"namespace": "team", "name": "train", "uid": imex_group.group_uid("team", "train"), "channel": channel}
    return {
        "metadata": {"name": "imex-" + gang["uid"], "namespace": imex.NAMESPACE, "generation": 1},
        "spec": {"clique": CLIQUE, "nodes": [NODE, PEER], "gangs": [{**gang, "claims": claims}]},
        "status": {"nodes": [{"node": n, "ready": True, "observedGeneration": 1} for n in (NODE, PEER)]},
    }


def test_a_labelled_claim_waits_for_its_groups_domain_then_gets_its_channel(drv: Any) -> None:
    d, objects, clock, told = drv
    error, _ = prepare(d, "a", "u-a")
    assert "waits for the group's IMEX domain" in error and "IMEX group 'train'" in error and "retried" in error
    assert "u-a" not in d.state.snapshot().claims  # nothing prepared, nothing recorded
    clock.now += 60
    assert "waited 60s of at most 120s" in prepare(d, "a", "u-a")[0]
    objects.append(group_domain("u-a"))
    error, spec = prepare(d, "a", "u-a")
    assert error == "" and d.state.snapshot().claims["u-a"].imex_channel == 5
    assert "/dev/nvidia-caps-imex-channels/channel5" in [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert told == []


def test_past_the_bound_a_labelled_claim_is_prepared_without_a_channel_and_told(drv: Any) -> None:
    d, _, clock, told = drv
    assert prepare(d, "a", "u-a")[0] != ""
    clock.now += 120
    error, _ = prepare(d, "a", "u-a")
    assert error == "" and d.state.snapshot().claims["u-a"].imex_channel is None
    ((name, why),) = told
    assert name == "a" and "within 120s; prepared without an IMEX channel" in why


def test_an_unlabelled_or_badly_labelled_claim_never_waits(drv: Any) -> None:
    d, _, _, told = drv
    assert prepare(d, "plain", "u-p", None)[0] == ""
    assert prepare(d, "bad", "u-b", "Not_A_Label", "gpu-1")[0] == ""
    assert told == []


def test_a_labelled_gang_members_claim_follows_its_gang_and_never_waits(drv: Any) -> None:
    d, _, _, told = drv
    c = driverkit.make_claim("g-0", NODE, ["gpu-0"], namespace="team", uid="u-g0")
    c["metadata"]["labels"] = {imex_group.LABEL: "train", names.LABEL_GANG: "g"}
    d.claims.add(c)
    assert d.state.prepare([driverkit.ref(c)])["u-g0"].error == ""
    assert told == [] and d.state.snapshot().claims["u-g0"].imex_channel is None


def test_a_labelled_claim_named_but_not_ready_waits_on_readiness(drv: Any) -> None:
    d, objects, _, _ = drv
    obj = group_domain("u-a")
    obj["status"]["nodes"][1]["ready"] = False
    objects.append(obj)
    assert "is not ready on node(s) tray-1" in prepare(d, "a", "u-a")[0]


def test_the_controllers_index_keeps_what_grouping_reads() -> None:
    body = claim("a", "tray-0", created="2026-01-01T00:05:00Z")
    kept = indexed.claim(body)
    assert groups.group_of(kept) == imex_group.group_of(body) == ("train", "") and groups.pool_node(kept) == "tray-0"
    assert groups.created_at(kept) == kubetime.epoch("2026-01-01T00:05:00Z") > 0
    plain = indexed.claim(claim("b", "tray-0", None))
    assert not plain.labels and plain.created is None  # as before
    out = groups.gather(make_world([body, claim("c", "tray-1")]), CLIQUES, {})
    assert [g.nodes for g in out.gangs] == [("tray-0", "tray-1")]


def test_the_drivers_group_wait_is_a_flag_with_a_bound() -> None:
    assert config.parse_args(["--node-name", "n"]).imex_group_wait_s == 120.0
    assert config.parse_args(["--node-name", "n", "--imex-group-wait", "30"]).imex_group_wait_s == 30.0
    with pytest.raises((SystemExit, ValueError)):
        config.parse_args(["--node-name", "n", "--imex-group-wait", "0"])
