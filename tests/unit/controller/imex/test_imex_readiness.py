"""What a gang is told of its IMEX domain's readiness, and the readiness bound (``gpuplane.controller.imex.readiness``).

The drivers report their node's daemon in the domain's status; the leader's IMEX pass reads it: a node that
stops being ready (a daemon that exited and is being restarted, a lost peer) is a Warning on every gang of the
domain, naming the node and its driver's message; back to ready and the domain ready on every node are Normal
Events. A placed gang not running whose domain is still not ready past the bound is released the way a
placement the scheduler never follows is (``BindTimeout``): phase ``Preempted``, reason ``ImexNotReady``, member
pods and claims deleted. A domain nobody reports on (no daemons) is unknown, never a reason to release.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuplane.api import imex, kubetime
from gpuplane.controller import events
from gpuplane.controller.gang import reconciler, world
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.imex import hold, readiness
from gpuplane.controller.imex import reconcile as imex_reconcile
from gpuplane.controller.imex.api import ImexApi
from tests import controllerkit as kit
from tests.unit.controller.gang.test_gang_bind_timeout import _placed
from tests.unit.controller.imex.test_imex_controller import GPU_DOMAINS, FakeCustom, gang, make_world, rt_with

NODES = ("tray-0", "tray-1")


def domain(entries: list[tuple[str, bool, str, int]] = (), generation: int = 2) -> imex.ImexDomain:  # type: ignore[assignment]
    gangs = (
        imex.Gang("team-a", "wide", "uid-wide", 1, ()),
        imex.Gang("team-a", "narrow", "uid-narrow", 2, ()),
    )
    st = tuple(imex.NodeStatus(n, r, m, g) for n, r, m, g in entries)
    return imex.ImexDomain("imex-uid-wide", generation, "clique", NODES, gangs, st)


def test_node_states_name_why_each_node_is_not_ready() -> None:
    d = domain([("tray-0", True, "", 2), ("tray-1", True, "", 1)])
    states = readiness.node_states(d)
    assert states["tray-0"].ready and not states["tray-1"].ready
    assert "serves generation 1, not 2" in states["tray-1"].message
    d = domain([("tray-0", False, "nvidia-imex-ctl -q says NOT_READY", 2)])
    assert readiness.node_states(d)["tray-0"].message == "nvidia-imex-ctl -q says NOT_READY"
    assert readiness.node_states(d)["tray-1"].message == readiness.NO_REPORT


def test_a_domain_nobody_reports_on_is_unknown_not_unready() -> None:
    assert readiness.unready_by_gang([domain([])]) == {}  # --imex-daemons=off: never a reason to release
    got = readiness.unready_by_gang([domain([("tray-0", True, "", 2)])])
    assert got == {"uid-wide": {"tray-1": readiness.NO_REPORT}, "uid-narrow": {"tray-1": readiness.NO_REPORT}}
    ready = domain([("tray-0", True, "", 2), ("tray-1", True, "", 2)])
    assert readiness.unready_by_gang([ready]) == {"uid-wide": {}, "uid-narrow": {}}


def reasons(told: list[readiness.GangEvent]) -> list[tuple[str, str, str]]:
    return [(e.gang.name, e.type, e.reason) for e in told]


def test_each_gang_is_told_when_a_node_goes_and_comes_back() -> None:
    starting = domain([("tray-0", False, "waiting for peers", 2)])
    states, told = readiness.advance({}, [starting])
    assert told == []  # a leader's first look says nothing of what came before it
    states, told = readiness.advance(states, [domain([("tray-0", True, "", 2), ("tray-1", False, "slow", 2)])])
    assert told == []  # a node becoming ready during start-up is not "ready again"
    up = domain([("tray-0", True, "", 2), ("tray-1", True, "", 2)])
    states, told = readiness.advance(states, [up])
    assert reasons(told) == [("wide", "Normal", readiness.DOMAIN_READY), ("narrow", "Normal", readiness.DOMAIN_READY)]
    assert "ready on every node (tray-0, tray-1)" in told[0].message
    states, told = readiness.advance(states, [up])
    assert told == []  # nothing changed

    crashed = "nvidia-imex exited with code 3 (1 exit(s) in a row); restarted in 1s; see /p/imex-daemon.log"
    states, told = readiness.advance(states, [domain([("tray-0", True, "", 2), ("tray-1", False, crashed, 2)])])
    assert reasons(told) == [("wide", "Warning", readiness.NOT_READY), ("narrow", "Warning", readiness.NOT_READY)]
    assert told[0].message.startswith(f"IMEX daemon on node tray-1 is not ready any more: {crashed}")
    assert told[0].gang.uid == "uid-wide" and told[1].gang.uid == "uid-narrow"

    states, told = readiness.advance(states, [up])
    assert reasons(told) == [
        ("wide", "Normal", readiness.READY_AGAIN),
        ("wide", "Normal", readiness.DOMAIN_READY),
        ("narrow", "Normal", readiness.READY_AGAIN),
        ("narrow", "Normal", readiness.DOMAIN_READY),
    ]
    assert told[0].message == "IMEX daemon on node tray-1 is ready again"


def test_a_domain_seen_before_any_report_is_told_when_it_is_ready() -> None:
    states, told = readiness.advance({}, [domain([])])  # the pass that created it, or a look before any report
    assert told == [] and states == {"imex-uid-wide": {}}
    up = domain([("tray-0", True, "", 2), ("tray-1", True, "", 2)])
    _, told = readiness.advance(states, [up])
    assert reasons(told) == [("wide", "Normal", readiness.DOMAIN_READY), ("narrow", "Normal", readiness.DOMAIN_READY)]


def test_a_new_generation_not_served_yet_is_not_ready_but_no_warning() -> None:
    up = domain([("tray-0", True, "", 2), ("tray-1", True, "", 2)])
    states, _ = readiness.advance({}, [up])
    newer = domain([("tray-0", True, "", 2), ("tray-1", True, "", 2)], generation=3)  # a gang added to the domain
    states, told = readiness.advance(states, [newer])
    assert told == []  # the drivers confirm a new spec within a tick: no alarm
    assert "serves generation 2, not 3 yet" in readiness.unready_by_gang([newer])["uid-wide"]["tray-0"]
    _, told = readiness.advance(states, [domain([("tray-0", True, "", 3), ("tray-1", True, "", 3)], generation=3)])
    assert reasons(told) == [("wide", "Normal", readiness.DOMAIN_READY), ("narrow", "Normal", readiness.DOMAIN_READY)]


def test_the_bound_releases_only_a_reported_unready_domain_past_it_before_every_member_runs() -> None:
    placed = {"placedAt": kubetime.rfc3339(1000.0)}
    late = readiness.overdue({"tray-1": "slow"}, placed, 0, 2, now=1301.0, timeout_s=300.0)
    assert late is not None and "not ready: tray-1: slow" in late and "readiness bound 300s" in late
    assert readiness.overdue({"tray-1": "slow"}, placed, 0, 2, now=1299.0, timeout_s=300.0) is None  # within
    assert readiness.overdue({}, placed, 0, 2, now=2000.0, timeout_s=300.0) is None  # ready
    assert readiness.overdue(None, placed, 0, 2, now=2000.0, timeout_s=300.0) is None  # unknown: no report
    assert readiness.overdue({"tray-1": "x"}, placed, 2, 2, now=2000.0, timeout_s=300.0) is None  # all running
    assert readiness.overdue({"tray-1": "x"}, placed, 0, 2, now=2000.0, timeout_s=0.0) is None  # off
    assert readiness.overdue({"tray-1": "x"}, {}, 0, 2, now=2000.0, timeout_s=300.0) is None  # not placed


# --- the gang reconcile ------------------------------------------------------------------------------


@pytest.fixture(scope="module", name="slices")
def slices_fixture(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return kit.cluster_slices(tmp_path_factory.mktemp("sim"))


def decide_with(w: world.World, key: str, now: float, written: hold.Written) -> reconciler.Outcome:
    settings = reconciler.Settings(eviction_grace_s=0, imex_ready_timeout_s=300.0)
    return kit.decide(w, key, now, settings=settings, imex=written)


def test_a_gang_whose_domain_stays_not_ready_is_released_with_the_reason(slices: list[dict[str, Any]]) -> None:
    w, key = _placed(slices, kit.T0)
    uid = w.gangs[key].uid
    unready = hold.Written(at=kit.T0, unready={uid: {"tray-1": "nvidia-imex-ctl -q says NOT_READY"}})
    out = decide_with(w, key, kit.T0 + 301, unready)
    assert out.status["phase"] == "Preempted" and out.status["reason"] == readiness.RELEASED, out.status
    assert "not ready: tray-1: nvidia-imex-ctl -q says NOT_READY" in out.status["message"]
    assert [e[1] for e in out.events if e[0] == "Warning"] == [readiness.RELEASED]
    assert sorted(s.kind for s in out.steps) == ["delete-claim", "delete-claim", "delete-pod", "delete-pod"]
    assert out.status.get("placement") is None

    within = decide_with(w, key, kit.T0 + 299, unready)
    assert within.status["phase"] != "Preempted" and not [s for s in within.steps if s.kind.startswith("delete")]
    for other in (hold.Written(at=kit.T0, unready={uid: {}}), hold.Written(at=kit.T0)):  # ready; no report
        kept = decide_with(w, key, kit.T0 + 1000, other)
        assert kept.status["phase"] != "Preempted", kept.status


# --- the pass tells the gangs ------------------------------------------------------------------------


def test_the_pass_looks_at_the_status_between_passes_and_tells_each_gang() -> None:
    custom = FakeCustom()
    rt = rt_with(custom, [True])
    rt.state(gang_run.GangState).domains.of = lambda w: GPU_DOMAINS
    told: list[tuple[str, events.EventType, str, str]] = []
    one = imex_reconcile.Pass(
        rt, lambda: make_world([gang("a", ["tray-0", "tray-1"])]), ImexApi(rt.writer), events.ListRecorder(told)
    )
    assert not one.watch_due(0.0)  # no domain known yet
    asyncio.run(one.once(0.0))
    (name,) = custom.named
    obj = custom.named[name]
    generation = obj["metadata"].get("generation", 0)
    obj["status"] = {"nodes": [{"node": n, "ready": True, "observedGeneration": generation} for n in NODES]}
    assert one.watch_due(imex_reconcile.WATCH_S)
    asyncio.run(one.look(imex_reconcile.WATCH_S))
    assert rt.state(hold.ImexState).written is not None and rt.state(hold.ImexState).written.unready == {"uid-a": {}}
    assert [(g, r) for g, _, r, _ in told] == [("a", readiness.DOMAIN_READY)]  # created by this pass, now ready
    told.clear()

    obj["status"]["nodes"][1] = {"node": "tray-1", "ready": False, "message": "peer lost", "observedGeneration": 0}
    asyncio.run(one.look(2 * imex_reconcile.WATCH_S))
    assert told == [
        (
            "a",
            "Warning",
            readiness.NOT_READY,
            "IMEX daemon on node tray-1 is not ready any more: peer lost. New member prepares on domain "
            f"{name} wait for it; running members' cross-node memory with tray-1 may fail until it is back",
        )
    ]
    assert rt.state(hold.ImexState).written.unready == {"uid-a": {"tray-1": "peer lost"}}
    assert rt.state(hold.ImexState).written.listed  # the status-only look kept what the pass wrote

    custom.failing["list"] = 500  # a failed look changes nothing and releases no gang's gates
    before = rt.state(hold.ImexState).written
    asyncio.run(one.look(3 * imex_reconcile.WATCH_S))
    assert rt.state(hold.ImexState).written is before and before.failed == ""
