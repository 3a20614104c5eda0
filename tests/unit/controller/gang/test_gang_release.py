"""A deleted GpuGang is released by whichever replica leads, before kopf lets the object go.

``gpuplane.controller.gang.handlers.release`` is the body of the gang's kopf ``on.delete`` handler:
returning lets kopf remove its finalizer (the gang is gone), raising :class:`kopf.TemporaryError`
keeps the gang ``Terminating`` and kopf asks again. Before, the release ran on the watch's
``DELETED`` event in the leader only, so a gang deleted while no replica led (the leader killed, the
standby's Lease not yet won) left its member pods running on deleted claims.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
import pytest

from gpuplane.api import boundedjson
from gpuplane.controller import caches, config, events, kube, metrics, runtime, steps
from gpuplane.controller.gang import deleted, handlers, world
from gpuplane.controller.gang import run as gang_run
from gpuplane.informer.cache import Caches, Informer
from tests.controllerkit import Flag, claim_index, gang_index, holding, pod_index
from tests.templatekit import NS

KEY = f"{NS}/g"


@dataclass
class Recorder:
    """A KubeWriter stand-in: every write and Event in order; ``fail`` names steps that raise."""

    flag: Flag
    fail: dict[str, Exception] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def run(self, namespace: str, step: steps.Step) -> None:
        if step.name in self.fail:
            raise self.fail[step.name]
        self.calls.append((step.kind, namespace, step.name))

    def event(self, ref: events.ObjectRef, kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", ref.kind, ref.name, kind, reason, message))


def setup(leading: bool = True, fail: dict[str, Exception] | None = None) -> tuple[runtime.Runtime, Recorder, Flag]:
    flag = Flag(leading, term=1)
    rec = Recorder(flag, fail or {})
    cfg = config.parse_args(["--identity", "a"], {"GPUPLANE_EVICTION_GRACE": "5"})
    rt = runtime.Runtime.create(cfg, rec, metrics.ControllerMetrics(), flag)  # type: ignore[arg-type]
    return rt, rec, flag


def running_gang() -> tuple[dict[str, Any], Callable[[], world.World]]:
    body, pods, claims = holding("g", NS, 0, ["hgx-0", "hgx-1"], 0.0)
    body["metadata"]["uid"] = "uid-g"
    body["status"]["phase"] = "Running"
    w = world.World(
        gangs=gang_index([body]),
        pods=world.member_lists(pod_index(pods)),
        claims=claim_index(claims),
        slices=(),
        nodes={},
        classes={},
    )
    return body, lambda: w


def never() -> world.World:
    raise AssertionError("the world was read by a replica that must not decide")


def test_the_leader_tells_the_members_then_deletes_them_and_their_claims_and_lets_the_gang_go() -> None:
    rt, rec, _ = setup()
    body, w = running_gang()
    asyncio.run(handlers.release(rt, KEY, body, w, 0.0))  # returns: kopf removes its finalizer
    kinds = [(c[0], c[2]) for c in rec.calls]
    assert kinds == [
        ("event", "g-pod-0"),
        ("event", "g-pod-1"),
        ("delete-pod", "g-pod-0"),
        ("delete-pod", "g-pod-1"),
        ("delete-claim", "g-0"),
        ("delete-claim", "g-1"),
    ]
    assert all(c[4] == deleted.REASON and "was deleted while Running" in c[5] for c in rec.calls[:2])


def test_a_standby_answers_not_yet_and_reads_and_writes_nothing() -> None:
    rt, rec, _ = setup(leading=False)
    body, _ = running_gang()
    with pytest.raises(kopf.TemporaryError) as asked:
        asyncio.run(handlers.release(rt, KEY, body, never, 0.0))
    assert asked.value.delay == handlers.RETRY_S and "leader" in str(asked.value)
    assert rec.calls == []


def test_the_standby_that_wins_the_lease_releases_on_kopfs_next_attempt() -> None:
    """The leak: the leader is killed, the gang deleted meanwhile. The standby's first attempt keeps the
    gang; once it leads, the next attempt releases everything the gang still holds."""
    rt, rec, flag = setup(leading=False)
    body, w = running_gang()
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(handlers.release(rt, KEY, body, w, 0.0))
    flag.leading, flag.term = True, 2
    asyncio.run(handlers.release(rt, KEY, body, w, 17.0))
    assert [c[0] for c in rec.calls].count("delete-pod") == 2 and [c[0] for c in rec.calls].count("delete-claim") == 2


def test_nothing_left_writes_nothing_and_lets_the_gang_go() -> None:
    rt, rec, _ = setup()
    body, _ = running_gang()
    empty = world.World(gangs=gang_index([body]), pods={}, claims={}, slices=(), nodes={}, classes={})
    asyncio.run(handlers.release(rt, KEY, body, lambda: empty, 0.0))
    assert rec.calls == []


def test_before_the_indexes_are_complete_even_the_leader_waits() -> None:
    rt, rec, _ = setup()
    rt.caches = Caches([Informer(None, caches.streams(rt.metrics)[0])])  # listed, not yet synced
    body, _ = running_gang()
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(handlers.release(rt, KEY, body, never, 0.0))
    assert rec.calls == []
    rt.caches.informers[0].synced.set()
    asyncio.run(handlers.release(rt, KEY, body, lambda: world.World({}, {}, {}, (), {}, {}), 0.0))  # synced: released


def test_a_failed_write_is_retried_until_the_bound_then_the_gang_is_let_go_with_a_warning() -> None:
    rt, rec, _ = setup(fail={"g-pod-1": kube.StepFailed("delete-pod ns/g-pod-1: 403 Forbidden")})
    body, w = running_gang()
    with pytest.raises(kopf.TemporaryError) as asked:
        asyncio.run(handlers.release(rt, KEY, body, w, 10.0))
    assert "delete-pod g-pod-1" in str(asked.value) and "403 Forbidden" in str(asked.value)
    assert ("delete-claim", NS, "g-1") in rec.calls  # a failed step does not stop the others
    rec.calls.clear()
    asyncio.run(handlers.release(rt, KEY, body, w, handlers.GIVE_UP_S + 1))  # past the bound: let go
    (warning,) = [c for c in rec.calls if c[0] == "event" and c[1] == "GpuGang"]
    assert warning[2:5] == ("g", "Warning", deleted.ABANDONED)
    assert "403 Forbidden" in warning[5] and "kubectl get pods,resourceclaims -l gpuplane.dev/gang=g" in warning[5]


def test_losing_the_lease_mid_release_leaves_the_rest_to_the_next_leader() -> None:
    rt, _, flag = setup()
    body, w = running_gang()

    class Lost(Recorder):
        def run(self, namespace: str, step: steps.Step) -> None:
            flag.leading = False  # the Lease lapsed after the first write: the writer's fence refuses the rest
            if self.calls and self.calls[-1][0] != "event":
                raise kube.NotLeader("not the leader: write skipped")
            super().run(namespace, step)

    rt.writer = Lost(flag)  # type: ignore[assignment]
    with pytest.raises(kopf.TemporaryError) as asked:
        asyncio.run(handlers.release(rt, KEY, body, w, 0.0))
    assert "next leader" in str(asked.value)


def test_an_unreadable_gang_is_let_go_at_once() -> None:
    rt, rec, _ = setup(leading=False)
    stub = {boundedjson.REJECTED: "nested too deeply", "metadata": {"name": "g", "namespace": NS}}
    asyncio.run(handlers.release(rt, KEY, stub, never, 0.0))
    assert rec.calls == []


def test_the_deleted_event_only_drops_this_replicas_caches() -> None:
    rt, rec, _ = setup()
    rt.state(gang_run.GangState).overlay[KEY] = (0.0, {"phase": "Placed"})
    handlers.gang_gone(rt, KEY)
    assert KEY not in rt.state(gang_run.GangState).overlay and rec.calls == []


def test_a_terminating_gang_is_not_reconciled_meanwhile() -> None:
    """Between the deletion and its release (no leader yet) a resync must not place or lift gates again."""

    class Boom:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"{name} called for a gang being deleted")

    rt, _, _ = setup()
    rt.writer = Boom()  # type: ignore[assignment]
    body, w = running_gang()
    body["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    body["status"] = {"phase": "Pending"}  # would be queued and placed, were it alive
    deleting = dataclasses.replace(w(), gangs=gang_index([body]))
    assert deleting.gangs[KEY].deleting
    asyncio.run(gang_run.reconcile_gang(rt, KEY, deleting, 0.0))
