"""controller.imex wiring: placed gangs read from the indexes, the pass's writes, the loop's API calls."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpuplane.api import imex
from gpuplane.api import names as dn
from gpuplane.controller import config, indexed, kube, metrics, names, runtime
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.gang import world
from gpuplane.controller.imex import gangs, objects, reconcile
from gpuplane.controller.imex.api import ImexApi
from gpuplane.informer.client import ApiError, Resource
from testing.kubeapi import Call, FakeApi
from tests.controllerkit import gang_index, pod_index

NS = "team"
CLIQUE = "cluster-1.0"
TRAYS = [f"tray-{i}" for i in range(4)]
GPU_DOMAINS = {f"{n}/gpu-{g}": CLIQUE for n in TRAYS for g in range(4)} | {"hgx-0/gpu-0": "hgx-0.nvl0"}


def gang(name: str, nodes: Sequence[str], *, phase: str = "Running", placed_at: str = "2026-01-01T00:00:00Z") -> Any:
    members = {str(i): n for i, n in enumerate(nodes)}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "creationTimestamp": placed_at},
        "spec": {"members": len(nodes), "gpusPerMember": 4},
        "status": {
            "phase": phase,
            "placedAt": placed_at,
            "placement": {
                "id": "x",
                "domains": [CLIQUE],
                "members": members,
                "devices": {k: "gpu-0,gpu-1,gpu-2,gpu-3" for k in members},
            },
        },
    }


def claim(name: str, node: str | None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if node is not None:
        results = [{"driver": dn.DRIVER_NAME, "request": "gpus", "pool": node, "device": "gpu-0"}]
        status["allocation"] = {"devices": {"results": results}}
    return {"metadata": {"name": name, "namespace": NS, "uid": f"cuid-{name}"}, "status": status}


def make_world(gangs_: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]] = ()) -> world.World:
    if not claims:  # every member's named claim, allocated on the node the placement chose
        claims = [
            claim(f"{g['metadata']['name']}-{i}", n)
            for g in gangs_
            for i, n in g["status"]["placement"]["members"].items()
        ]
    return world.World(
        gangs=gang_index(gangs_),
        pods={},
        claims={f"{NS}/{c['metadata']['name']}": indexed.claim(c) for c in claims},
        slices=(),
        nodes={},
        classes={},
    )


def test_node_cliques_are_the_one_domain_of_a_nodes_gpus() -> None:
    mixed = {"n/gpu-0": "a", "n/gpu-1": "b"}
    assert gangs.node_cliques({**GPU_DOMAINS, **mixed}) == {
        **dict.fromkeys(TRAYS, CLIQUE),
        "hgx-0": "hgx-0.nvl0",
        "n": "",
    }


def test_a_gang_across_two_trays_gets_a_domain_naming_each_claim_on_its_node() -> None:
    out = reconcile.desired(make_world([gang("g", ["tray-0", "tray-1"])]), GPU_DOMAINS, [])
    (obj,) = out.diff.create
    model, why = imex.parse_domain(obj)
    assert why == "" and model is not None
    assert model.name == "imex-uid-g" and model.nodes == ("tray-0", "tray-1") and model.clique == CLIQUE
    (g,) = model.gangs
    assert (g.namespace, g.name, g.uid, g.channel) == (NS, "g", "uid-g", 1)
    assert [(c.name, c.uid, c.node) for c in g.claims] == [("g-0", "cuid-g-0", "tray-0"), ("g-1", "cuid-g-1", "tray-1")]
    assert obj["metadata"]["namespace"] == imex.NAMESPACE
    assert out.diff.update == () and out.diff.delete == ()


def test_a_gang_inside_one_tray_and_gangs_not_holding_get_nothing() -> None:
    w = make_world(
        [
            gang("one", ["tray-0", "tray-0"]),
            gang("done", ["tray-1", "tray-2"], phase="Succeeded"),
            gang("queued", ["tray-1", "tray-2"], phase="Pending"),
        ]
    )
    out = reconcile.desired(w, GPU_DOMAINS, [])
    assert out.diff == objects.Diff((), (), ()) and out.refused == {}


def test_a_second_gang_on_the_same_trays_shares_the_domain_with_another_channel() -> None:
    first = reconcile.desired(make_world([gang("a", ["tray-0", "tray-1"])]), GPU_DOMAINS, [])
    existing = list(first.diff.create)
    both = [gang("a", ["tray-0", "tray-1"]), gang("b", ["tray-1", "tray-0"], placed_at="2026-01-01T00:01:00Z")]
    out = reconcile.desired(make_world(both), GPU_DOMAINS, existing)
    assert out.diff.create == () and out.diff.delete == ()
    (obj,) = out.diff.update
    model, _ = imex.parse_domain(obj)
    assert model is not None and model.name == "imex-uid-a"
    assert {g.name: g.channel for g in model.gangs} == {"a": 1, "b": 2}
    plan = imex.claims_on([model], "tray-1")
    assert {uid: c.channel for uid, c in plan.claims.items()} == {"cuid-a-1": 1, "cuid-b-0": 2}


def test_a_gang_keeps_the_channel_the_existing_object_gives_it() -> None:
    made = reconcile.desired(make_world([gang("a", ["tray-0", "tray-1"])]), GPU_DOMAINS, []).diff.create
    moved = [{**made[0], "spec": {**made[0]["spec"], "gangs": [{**made[0]["spec"]["gangs"][0], "channel": 7}]}}]
    out = reconcile.desired(make_world([gang("a", ["tray-0", "tray-1"])]), GPU_DOMAINS, moved)
    assert out.diff == objects.Diff((), (), ()) and out.plan.channels == {"uid-a": 7}


def test_a_garbled_object_gives_no_channel_and_is_replaced() -> None:
    garbled = {"metadata": {"name": "imex-uid-a"}, "spec": {"clique": CLIQUE, "nodes": "tray-0", "gangs": []}}
    out = reconcile.desired(make_world([gang("a", ["tray-0", "tray-1"])]), GPU_DOMAINS, [garbled])
    (obj,) = out.diff.update
    assert obj["spec"]["gangs"][0]["channel"] == 1


def test_the_domain_goes_when_its_gangs_end() -> None:
    made = reconcile.desired(make_world([gang("a", ["tray-0", "tray-1"])]), GPU_DOMAINS, []).diff.create
    stray = {"metadata": {"name": "imex-hand-made"}, "spec": {}}
    out = reconcile.desired(make_world([gang("a", ["tray-0", "tray-1"], phase="Failed")]), GPU_DOMAINS, [*made, stray])
    assert out.diff == objects.Diff((), (), ("imex-hand-made", "imex-uid-a"))


def test_claims_not_indexed_yet_are_left_out_and_a_gang_without_any_waits() -> None:
    g = gang("a", ["tray-0", "tray-1"])
    out = reconcile.desired(make_world([g], [claim("a-1", "tray-1")]), GPU_DOMAINS, [])
    (obj,) = out.diff.create
    assert [c["name"] for c in obj["spec"]["gangs"][0]["claims"]] == ["a-1"]
    assert obj["spec"]["nodes"] == ["tray-0", "tray-1"]  # the placement's nodes, claims known or not
    none_yet = reconcile.desired(make_world([g], [claim("other", "tray-0")]), GPU_DOMAINS, [])
    assert none_yet.diff == objects.Diff((), (), ())


def test_an_unallocated_claim_sits_on_the_node_the_placement_chose() -> None:
    w = make_world([gang("a", ["tray-0", "tray-1"])], [claim("a-0", None), claim("a-1", "tray-1")])
    (obj,) = reconcile.desired(w, GPU_DOMAINS, []).diff.create
    assert [(c["name"], c["node"]) for c in obj["spec"]["gangs"][0]["claims"]] == [("a-0", "tray-0"), ("a-1", "tray-1")]


def test_a_template_members_claims_are_its_pods() -> None:
    g = gang("t", ["tray-0", "tray-1"])
    pods = [
        {
            "metadata": {
                "name": f"t-{i}",
                "namespace": NS,
                "uid": f"p{i}",
                "labels": {names.LABEL_GANG: "t", names.LABEL_MEMBER_INDEX: str(i)},
            },
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"t-{i}-gpu-x"}]},
        }
        for i in range(2)
    ]
    w = make_world([g], [claim("t-0-gpu-x", "tray-0"), claim("t-1-gpu-x", "tray-1")])
    w = world.World(
        gangs=w.gangs, pods=world.member_lists(pod_index(pods)), claims=w.claims, slices=(), nodes={}, classes={}
    )
    assert {p.templated for p in w.members(f"{NS}/t", 2).by_index.values()} == {True}
    (obj,) = reconcile.desired(w, GPU_DOMAINS, []).diff.create
    assert [c["name"] for c in obj["spec"]["gangs"][0]["claims"]] == ["t-0-gpu-x", "t-1-gpu-x"]


def test_a_gang_across_nodes_without_one_clique_is_refused_not_written() -> None:
    g = gang("x", ["tray-0", "hgx-0"])
    out = reconcile.desired(make_world([g]), GPU_DOMAINS, [])
    assert out.diff == objects.Diff((), (), ())
    assert "different NVLink cliques" in out.refused["uid-x"]


def test_a_status_no_replica_wrote_is_skipped_not_raised() -> None:
    g = gang("bad", ["tray-0", "tray-1"])
    g["status"]["placement"]["members"] = {"zero": "tray-0", "1": "tray-1"}
    good = gang("good", ["tray-2", "tray-3"])
    out = reconcile.desired(make_world([g, good]), GPU_DOMAINS, [])
    assert [o["metadata"]["name"] for o in out.diff.create] == ["imex-uid-good"]


# --- the pass and its API calls -------------------------------------------------------------------


class FakeCustom(FakeApi):
    """The ImexDomains in the API, in memory: the writes as (verb, name); ``failing``: verb -> status."""

    VERBS = {"GET": "list", "POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "replace"}
    WHERE = Resource(imex.GROUP, imex.VERSION, imex.PLURAL).path(imex.NAMESPACE)

    def __init__(self) -> None:
        super().__init__()
        self.failing: dict[str, int] = {}

    def request(self, method: str, path: str, **kw: Any) -> Any:
        assert path.startswith(self.WHERE), path  # only the controller's namespace
        if self.VERBS[method] in self.failing:
            self.calls.append(Call(method, path, {}, kw.get("body"), ""))
            raise ApiError(self.failing[self.VERBS[method]], "nope", "refused")
        return super().request(method, path, **kw)

    def put(self, name: str, obj: dict[str, Any]) -> None:
        self.objects[f"{self.WHERE}/{name}"] = obj

    @property
    def named(self) -> dict[str, dict[str, Any]]:
        return {p.rsplit("/", 1)[1]: o for p, o in self.objects.items()}

    @property
    def writes(self) -> list[tuple[str, str]]:
        out = []
        for c in self.calls:
            if c.method != "GET":
                name = c.body["metadata"]["name"] if c.method == "POST" else c.path.rsplit("/", 1)[1]
                out.append((self.VERBS[c.method], name))
        return out


def rt_with(custom: FakeCustom, leader: list[bool]) -> Any:
    writer = kube.KubeWriter(custom, guard=lambda: leader[0])
    return runtime.Runtime.create(config.parse_args(["--identity", "t"], {}), writer, metrics.ControllerMetrics())


def test_a_pass_creates_then_updates_then_deletes_and_is_quiet_when_nothing_changed() -> None:
    custom, state = FakeCustom(), {"gangs": [gang("a", ["tray-0", "tray-1"])]}
    rt = rt_with(custom, [True])
    rt.state(gang_run.GangState).domains.of = lambda w: GPU_DOMAINS
    one = reconcile.Pass(rt, lambda: make_world(state["gangs"]), ImexApi(rt.writer))

    asyncio.run(one.once(0.0))
    assert custom.writes == [("create", "imex-uid-a")]
    assert not one.due(1.0)  # nothing indexed changed
    asyncio.run(one.once(1.0))
    assert custom.writes == [("create", "imex-uid-a")]  # the same plan: no write
    assert one.due(reconcile.RESYNC_S + 1)

    state["gangs"] = [
        gang("a", ["tray-0", "tray-1"]),
        gang("b", ["tray-0", "tray-1"], placed_at="2026-01-02T00:00:00Z"),
    ]
    rt.touched()
    assert one.due(2.0)
    asyncio.run(one.once(2.0))
    assert custom.writes[-1] == ("patch", "imex-uid-a")
    channels = {g["name"]: g["channel"] for g in custom.named["imex-uid-a"]["spec"]["gangs"]}
    assert channels == {"a": 1, "b": 2}

    state["gangs"] = []
    rt.touched()
    asyncio.run(one.once(3.0))
    assert custom.writes[-1] == ("delete", "imex-uid-a") and custom.named == {}


def test_a_create_that_finds_the_object_replaces_its_spec_and_a_failure_is_retried_later() -> None:
    custom = FakeCustom()
    custom.put("imex-uid-a", {"metadata": {"name": "imex-uid-a"}, "spec": {"junk": 1, "gangs": []}})
    api = ImexApi(rt_with(custom, [True]).writer)
    obj = reconcile.desired(make_world([gang("a", ["tray-0", "tray-1"])]), GPU_DOMAINS, []).diff.create[0]
    assert api.apply(objects.Diff((obj,), (), ())) == []
    assert custom.writes == [("create", "imex-uid-a"), ("patch", "imex-uid-a")]
    assert custom.named["imex-uid-a"]["spec"] == {"junk": 1, **obj["spec"]}  # a merge patch (the CRD prunes junk)

    custom.failing["delete"] = 500
    failed = api.apply(objects.Diff((), (), ("imex-uid-a", "imex-other")))
    assert [f.split(":")[0] for f in failed] == ["delete imex-uid-a", "delete imex-other"]  # every write tried

    rt = rt_with(custom, [True])
    rt.state(gang_run.GangState).domains.of = lambda w: GPU_DOMAINS
    one = reconcile.Pass(rt, lambda: make_world([]), ImexApi(rt.writer))
    asyncio.run(one.once(10.0))
    assert not one.due(11.0) and one.due(10.0 + reconcile.RETRY_S)


def test_a_replica_that_lost_the_lease_writes_nothing() -> None:
    custom = FakeCustom()
    rt = rt_with(custom, [False])
    rt.state(gang_run.GangState).domains.of = lambda w: GPU_DOMAINS
    one = reconcile.Pass(rt, lambda: make_world([gang("a", ["tray-0", "tray-1"])]), ImexApi(rt.writer))
    with pytest.raises(kube.NotLeader):
        asyncio.run(one.once(0.0))
    assert custom.writes == [] and custom.named == {}


def test_without_the_crd_a_pass_writes_nothing_and_says_so_once() -> None:
    custom = FakeCustom()
    custom.failing["list"] = 404
    rt = rt_with(custom, [True])
    one = reconcile.Pass(rt, lambda: make_world([gang("a", ["tray-0", "tray-1"])]), ImexApi(rt.writer))
    assert asyncio.run(one.once(0.0)) is None and one.unserved
    assert custom.writes == [] and not one.due(1.0)


def test_the_controller_starts_the_imex_loop_on_its_registry() -> None:
    from gpuplane.controller import config, handlers

    reg = handlers.make_registry(config.parse_args(["--identity", "x"], {}))
    started = {h.id.rsplit(".", 1)[-1] for h in reg._activities.get_all_handlers()}
    assert "start_imex" in started
