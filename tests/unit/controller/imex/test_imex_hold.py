"""A gang across GB200 trays keeps its gates until its IMEX domain lists every member claim (issue 35).

The pure rule (:func:`gpuplane.controller.imex.hold.decide`), then the gang reconcile and the IMEX pass
together on the simulator's cluster: placed -> claims made, gates held -> the pass's plan lists the claims ->
gates lifted; and the ways a gang goes on without its domain (no CRD, a failing pass, a refusal, the bound),
each but the first with a Warning on the gang.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from gpuplane.api import kubetime
from gpuplane.controller import kube
from gpuplane.controller.gang import reconciler, world
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.imex import hold
from gpuplane.controller.imex import reconcile as imex_reconcile
from gpuplane.controller.imex.api import ImexApi
from tests import controllerkit
from tests.controllerkit import GB200, H100, T0, FakeApi, apply_all, gang_body, make_world, member_pod, run_pass
from tests.unit.controller.imex.test_imex_controller import FakeCustom, rt_with

KEY = "team-a/train"
SPEC: Mapping[str, Any] = {"members": 2, "gpusPerMember": 4, "tensorParallelSize": 8, "selectors": [GB200]}
NOW = T0 + 10


@pytest.fixture(scope="module")
def cluster_slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return controllerkit.cluster_slices(tmp_path_factory.mktemp("sim"))


# --- the rule --------------------------------------------------------------------------------------


def fresh(**kw: Any) -> hold.Written:
    return hold.Written(at=NOW, **kw)


def test_the_rule_holds_only_while_the_plan_is_served_healthy_recent_and_the_gang_unlisted() -> None:
    claims = ["c0", "c1"]
    d = lambda w, **kw: hold.decide("g", claims, w, since=kw.get("since", NOW), now=NOW)  # noqa: E731
    first = d(None)  # no pass yet in this leadership term: nothing known, so wait for it
    assert first.wait == f"waiting for the leader's first IMEX pass; at most {hold.HOLD_MAX_S:.0f}s"
    never = hold.decide("g", claims, None, since=NOW - hold.HOLD_MAX_S, now=NOW)
    assert never.wait == "" and never.note is not None and never.note[0] == hold.LATE
    assert "still waiting for the leader's first IMEX pass" in never.note[1]
    assert d(hold.Written(at=NOW, served=False)) == hold.NO_HOLD  # no CRD: quietly as before
    waiting = d(fresh(listed={"g": frozenset({"c0"})}))
    assert waiting.wait.startswith("waiting for the IMEX domain") and "1 of 2" in waiting.wait
    assert waiting.note is None
    assert d(fresh(listed={"g": frozenset({"c0", "c1", "other"})})) == hold.NO_HOLD
    # A failed write (an API server restart) or a stale pass: wait for a pass that wrote its plan, within the bound.
    failed = fresh(failed="the IMEX plan could not be written: create imex-x: 404 namespace not found")
    failing = d(failed)
    assert failing.note is None and "waiting for an IMEX pass that writes its plan" in failing.wait
    assert "404 namespace not found" in failing.wait
    late = hold.decide("g", claims, failed, since=NOW - hold.HOLD_MAX_S, now=NOW)
    assert late.wait == "" and late.note is not None and late.note[0] == hold.LATE
    assert "404 namespace not found" in late.note[1] and "without an IMEX channel" in late.note[1]
    stale = d(hold.Written(at=NOW - hold.STALE_S - 1))
    assert stale.note is None and "waiting for a fresh IMEX pass" in stale.wait
    refused = d(fresh(refused={"g": "all 2047 IMEX channels of clique c in use"}))
    assert refused.wait == "" and refused.note == (
        hold.REFUSED,
        "no IMEX domain for this gang: all 2047 IMEX channels of clique c in use; "
        "its members run without an IMEX channel",
    )
    late = d(fresh(), since=NOW - hold.HOLD_MAX_S)
    assert late.wait == "" and late.note is not None and late.note[0] == hold.LATE and "0 of 2" in late.note[1]
    assert late.event() == ("Warning", *late.note)


def test_a_claim_not_indexed_yet_is_never_listed() -> None:
    w = fresh(listed={"g": frozenset({"c0"})})
    assert hold.decide("g", ["c0", None], w, since=NOW, now=NOW).wait
    assert hold.decide("g", [], w, since=NOW, now=NOW).wait  # no member claim known: nothing to prepare yet


def test_only_two_or_more_nodes_of_one_clique_span_one_clique() -> None:
    cliques = {"a": "c1", "b": "c1", "h": "", "x": "c2"}
    assert hold.spans_one_clique(["a", "b"], cliques)
    assert not hold.spans_one_clique(["a", "a"], cliques)  # one node: NVLink peer-to-peer, no IMEX
    assert not hold.spans_one_clique(["a", "x"], cliques)  # two cliques: the plan refuses it
    assert not hold.spans_one_clique(["h", "h2"], cliques)  # no multi-node NVLink


# --- the gang reconcile with the IMEX pass's plan ----------------------------------------------------


def decide(w: world.World, imex: hold.Written | None, now: float = NOW) -> reconciler.Outcome:
    plan, view = run_pass(w, now)
    return reconciler.decide(
        KEY,
        w.gangs[KEY],
        w,
        planned=lambda: (plan, view),
        domains=lambda: world.gpu_domains(w),
        now=now,
        settings=reconciler.Settings(eviction_grace_s=0),
        imex=imex,
    )


def lifts(out: reconciler.Outcome) -> list[str]:
    return [s.name for s in out.steps if s.why == "lift the gang gate"]


def placed(cluster_slices: list[dict[str, Any]], imex: hold.Written | None, **spec: Any) -> tuple[Any, FakeApi]:
    """Gang ``train`` (2 x 4 GPUs: two trays of the NVL72 clique) placed with ``imex``, its steps applied."""
    spec = spec or dict(SPEC)
    body = gang_body("train", **spec)
    w = make_world(cluster_slices, [body], [member_pod("train", i) for i in range(spec["members"])])
    first = decide(w, imex)
    api = FakeApi(w)
    apply_all(api, first.steps)
    for c in api.claims.values():
        c["metadata"]["uid"] = f"cuid-{c['metadata']['name']}"
    return first, api


def after(cluster_slices: list[dict[str, Any]], first: reconciler.Outcome, api: FakeApi) -> world.World:
    """The world once the placement's status (of the default gang) and the applied steps are indexed."""
    st = {k: v for k, v in first.status.items() if v is not None}
    body = gang_body("train", status_=st, **SPEC)
    return make_world(cluster_slices, [body], list(api.pods.values()), list(api.claims.values()))


def test_gates_wait_for_the_domain_listing_every_member_claim_then_lift(cluster_slices: list[dict[str, Any]]) -> None:
    first, api = placed(cluster_slices, fresh())
    assert first.status["phase"] == "Placing"
    assert len(set(first.status["placement"]["members"].values())) == 2  # two trays
    kinds = [s.kind for s in first.steps]
    assert kinds == ["create-claim"] * 2 + ["patch-pod"] * 2 + ["wait"]  # claims and affinities, no gate
    assert first.status["message"].endswith(
        "; waiting for the IMEX domain to list every member claim (0 of 2 member claims listed); at most 60s"
    )
    assert ("Normal", "Placed", first.status["message"]) in first.events
    assert all(p["spec"]["schedulingGates"] for p in api.pods.values())

    w = after(cluster_slices, first, api)
    waiting = decide(w, fresh())
    assert [s.kind for s in waiting.steps] == ["wait"]
    assert waiting.status["phase"] == "Placing" and waiting.status["reason"] == hold.WAITING
    assert "waiting for the IMEX domain to list every member claim (0 of 2" in waiting.status["message"]
    assert ("Normal", hold.WAITING, waiting.status["message"]) in waiting.events  # said once, on the gang

    pass_ = imex_reconcile.desired(w, world.gpu_domains(w), [])  # the leader's IMEX pass over the same world
    (obj,) = pass_.diff.create
    assert sorted(c["uid"] for g in obj["spec"]["gangs"] for c in g["claims"]) == ["cuid-train-0", "cuid-train-1"]
    lifted = decide(w, pass_.written(NOW + 1))
    assert lifts(lifted) == ["train-pod-0", "train-pod-1"] and "wait" not in [s.kind for s in lifted.steps]
    assert not [e for e in lifted.events if e[0] == "Warning"]
    assert apply_all(api, lifted.steps)
    assert not any(p["spec"]["schedulingGates"] for p in api.pods.values())


def test_a_gang_placed_before_the_terms_first_pass_waits_for_it(cluster_slices: list[dict[str, Any]]) -> None:
    first, api = placed(cluster_slices, None)  # the leader's first IMEX pass has not run yet (start-up, failover)
    assert [s.kind for s in first.steps][-1] == "wait" and lifts(first) == []
    assert "waiting for the leader's first IMEX pass" in first.status["message"]
    w = after(cluster_slices, first, api)
    pass_ = imex_reconcile.desired(w, world.gpu_domains(w), [])
    assert lifts(decide(w, pass_.written(NOW + 1))) == ["train-pod-0", "train-pod-1"]


def test_a_pass_listing_another_claim_uid_does_not_lift(cluster_slices: list[dict[str, Any]]) -> None:
    first, api = placed(cluster_slices, fresh())
    w = after(cluster_slices, first, api)
    stale_uid = fresh(listed={"uid-train": frozenset({"cuid-train-0", "old-uid-of-train-1"})})
    assert lifts(decide(w, stale_uid)) == []  # a claim made again under its name is not the one listed


@pytest.mark.parametrize(
    ("imex", "reason"),
    [
        (hold.Written(at=NOW, served=False), None),  # no ImexDomain CRD: places as before, quietly
        (fresh(refused={"uid-train": "gang team-a/train spans nodes of different NVLink cliques"}), hold.REFUSED),
    ],
)
def test_a_gang_goes_on_without_its_domain_when_the_plan_cannot_name_it(
    cluster_slices: list[dict[str, Any]], imex: hold.Written | None, reason: str | None
) -> None:
    first, _ = placed(cluster_slices, imex)
    assert lifts(first) == ["train-pod-0", "train-pod-1"]  # in the placing reconcile itself
    warnings = [e for e in first.events if e[0] == "Warning"]
    if reason is None:
        assert warnings == []
    else:
        (event,) = warnings
        assert event[1] == reason and "its members run without an IMEX channel" in event[2]


def test_past_the_bound_the_gates_lift_with_a_warning(cluster_slices: list[dict[str, Any]]) -> None:
    first, api = placed(cluster_slices, fresh())
    w = after(cluster_slices, first, api)
    late = NOW + hold.HOLD_MAX_S + 1  # placedAt is NOW
    out = decide(w, hold.Written(at=late), now=late)
    assert lifts(out) == ["train-pod-0", "train-pod-1"]
    (event,) = [e for e in out.events if e[0] == "Warning"]
    assert event[1] == hold.LATE and "0 of 2 member claims listed" in event[2]
    assert kubetime.epoch(first.status["placedAt"]) == pytest.approx(NOW, abs=1)


def test_a_failed_imex_write_holds_the_gates_until_a_pass_writes_the_plan(cluster_slices: list[dict[str, Any]]) -> None:
    """The chaos e2e (session 39): the IMEX pass failed while kube-apiserver restarted, a gang placed just then had
    its gates lifted at once (``ImexNotWaited``) and its members were prepared without their channel."""
    failed = fresh(failed="the IMEX pass failed: MaxRetryError")
    first, api = placed(cluster_slices, failed)
    assert lifts(first) == [] and "the last: the IMEX pass failed: MaxRetryError" in first.status["message"]
    assert not [e for e in first.events if e[0] == "Warning"]
    w = after(cluster_slices, first, api)
    still = decide(w, failed)
    assert lifts(still) == [] and still.status["reason"] == hold.WAITING
    listed = fresh(listed={"uid-train": frozenset({"cuid-train-0", "cuid-train-1"})})
    assert lifts(decide(w, listed)) == ["train-pod-0", "train-pod-1"]  # the next pass wrote it: lifted


def test_a_gang_on_one_node_or_without_multi_node_nvlink_is_never_held(cluster_slices: list[dict[str, Any]]) -> None:
    one_tray, _ = placed(cluster_slices, fresh(), members=2, gpusPerMember=2, tensorParallelSize=4, selectors=[GB200])
    assert len(set(one_tray.status["placement"]["members"].values())) == 1
    assert lifts(one_tray) == ["train-pod-0", "train-pod-1"] and not one_tray.events[1:]
    hgx, _ = placed(cluster_slices, fresh(), members=2, gpusPerMember=8, selectors=[H100])
    assert len(set(hgx.status["placement"]["members"].values())) == 2  # two HGX nodes: NVLink inside each only
    assert lifts(hgx) == ["train-pod-0", "train-pod-1"]


def test_a_gang_whose_gates_are_lifted_is_never_put_back_to_wait(cluster_slices: list[dict[str, Any]]) -> None:
    first, api = placed(cluster_slices, hold.Written(at=NOW, served=False))  # no CRD: not held
    assert not any(p["spec"]["schedulingGates"] for p in api.pods.values())
    out = decide(after(cluster_slices, first, api), fresh())  # a plan that lists nothing of it
    assert out.steps == () and out.status["phase"] == "Placed"


# --- the pass leaves what it wrote for the gang reconcile -------------------------------------------


def test_each_pass_leaves_what_the_api_holds_in_the_shared_state() -> None:
    from tests.unit.controller.imex.test_imex_controller import GPU_DOMAINS, gang
    from tests.unit.controller.imex.test_imex_controller import make_world as imex_world

    custom = FakeCustom()
    rt = rt_with(custom, [True])
    rt.state(gang_run.GangState).domains.of = lambda w: GPU_DOMAINS
    one = imex_reconcile.Pass(rt, lambda: imex_world([gang("a", ["tray-0", "tray-1"])]), ImexApi(rt.writer))
    asyncio.run(one.once(0.0))
    got = rt.state(hold.ImexState).written
    assert got is not None and got.served and got.failed == ""
    assert got.listed == {"uid-a": frozenset({"cuid-a-0", "cuid-a-1"})} and got.refused == {}

    custom.objects.clear()
    custom.failing["create"] = 404  # the namespace does not exist
    rt.touched()
    asyncio.run(one.once(10.0))
    assert (
        rt.state(hold.ImexState).written is not None
        and "could not be written: create imex-uid-a: 404" in rt.state(hold.ImexState).written.failed
    )

    custom.failing = {"list": 404}  # the CRD is gone
    rt.touched()
    asyncio.run(one.once(20.0))
    assert rt.state(hold.ImexState).written is not None and not rt.state(hold.ImexState).written.served


def test_a_refused_gang_is_left_in_the_shared_state_as_refused() -> None:
    from tests.unit.controller.imex.test_imex_controller import GPU_DOMAINS, gang
    from tests.unit.controller.imex.test_imex_controller import make_world as imex_world

    out = imex_reconcile.desired(imex_world([gang("x", ["tray-0", "hgx-0"])]), GPU_DOMAINS, [])
    written = out.written(NOW)
    assert "different NVLink cliques" in written.refused["uid-x"] and written.listed == {}


def test_a_new_leadership_term_forgets_the_last_pass() -> None:
    from gpuplane.controller import config, leader, metrics, runtime

    cfg = config.parse_args(["--identity", "x"], {})
    rt = runtime.Runtime.create(cfg, kube.KubeWriter.__new__(kube.KubeWriter), metrics.ControllerMetrics())
    assert rt.leading()
    rt.state(hold.ImexState).written = fresh()
    assert rt.leading() and rt.state(hold.ImexState).written is not None  # the same term keeps it
    rt.leadership = leader.AlwaysLeader(term=2)
    assert rt.leading() and rt.state(hold.ImexState).written is None
