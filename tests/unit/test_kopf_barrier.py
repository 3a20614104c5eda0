"""kopf's start-up barrier with gpuplane.controller.kopf_barrier: no parked worker per fleet object, nothing lost.

The wrapper is exercised around a recording stand-in for kopf's ``process_resource_event`` on kopf's own
ToggleSet: a bypassed object is processed at once without the barrier and its toggle dropped; the
barrier still opens only when every object (and every resource's listing) is done; other resources keep
kopf's wait. ``startup.replay`` then does what the handlers deferred, once, for what still exists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._core.reactor import processing

from gpuplane.controller import kopf_barrier, startup


@pytest.fixture
def recorded() -> Iterator[list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []
    kept = processing.process_resource_event

    async def stand_in(**kw: Any) -> None:
        calls.append(kw)
        if kw.get("operator_indexed") is not None:  # what kopf does: drop its toggle, then wait
            await kw["operator_indexed"].drop_toggle(kw["resource_indexed"])
            await kw["operator_indexed"].wait_for(True)

    processing.process_resource_event = stand_in  # type: ignore[assignment]
    kopf_barrier.reset()
    try:
        kopf_barrier.install()
        yield calls
    finally:
        processing.process_resource_event = kept
        kopf_barrier.reset()


def _event(plural: str, toggles: Any, own: Any) -> dict[str, Any]:
    return {
        "resource": SimpleNamespace(plural=plural),
        "raw_event": {"type": None, "object": {}},
        "operator_indexed": toggles,
        "resource_indexed": own,
    }


def test_fleet_objects_do_not_wait_and_the_barrier_opens_only_when_all_are_indexed(
    recorded: list[dict[str, Any]],
) -> None:
    async def run() -> None:
        toggles = aiotoggles.ToggleSet(all)
        listing = await toggles.make_toggle(name="pods listed")
        pods = [await toggles.make_toggle(name=f"pod{i}") for i in range(50)]
        process = processing.process_resource_event
        for own in pods:  # each returns at once: no worker parks
            await asyncio.wait_for(process(**_event("pods", toggles, own)), 1)
        assert all(c["operator_indexed"] is None for c in recorded)  # handlers ran without the barrier
        assert not kopf_barrier.indexed()  # ... and were told to defer: the listing is not done
        assert not toggles.is_on()
        await listing.turn_to(True)
        assert toggles.is_on() and kopf_barrier.indexed()
        await asyncio.wait_for(kopf_barrier.wait_indexed(poll_s=0.01), 1)

    asyncio.run(run())


def test_other_resources_keep_kopfs_wait(recorded: list[dict[str, Any]]) -> None:
    async def run() -> None:
        toggles = aiotoggles.ToggleSet(all)
        listing = await toggles.make_toggle(name="gangs listed")
        gang = await toggles.make_toggle(name="gang0")
        task = asyncio.create_task(processing.process_resource_event(**_event("gpugangs", toggles, gang)))
        await asyncio.sleep(0.05)
        assert not task.done()  # parked at kopf's barrier, as before
        assert recorded[0]["operator_indexed"] is toggles
        await listing.turn_to(True)
        await asyncio.wait_for(task, 1)

    asyncio.run(run())


def test_without_a_barrier_everything_is_indexed(recorded: list[dict[str, Any]]) -> None:
    async def run() -> None:
        assert not kopf_barrier.opened()  # installed: nothing seen yet, so a start-up loop waits
        await processing.process_resource_event(**_event("pods", None, None))  # kopf: barrier already open
        assert kopf_barrier.opened() and kopf_barrier.indexed()

    asyncio.run(run())


def test_not_installed_never_defers() -> None:
    kopf_barrier.reset()
    assert kopf_barrier.indexed() and kopf_barrier.opened()


def test_replay_labels_each_node_once_and_checks_claims_that_still_exist() -> None:
    deferred = startup.Deferred()
    for node in ("n2", "n1", "n2", "n1", "n1"):  # one event per slice: five, for two nodes
        deferred.node(node)
    deferred.claim("ns/a", {"v": 1}, rejected=False)
    deferred.claim("ns/a", {"v": 2}, rejected=False)  # the latest body wins
    deferred.claim("ns/gone", {"v": 1}, rejected=False)
    deferred.claim("ns/bad", {"deep": True}, rejected=True)  # refused even though no index holds it
    labelled: list[str] = []
    checked: list[tuple[str, dict[str, Any], bool]] = []

    async def label(node: str) -> None:
        labelled.append(node)

    async def check(key: str, body: dict[str, Any], rejected: bool) -> None:
        checked.append((key, body, rejected))

    kopf_barrier.reset()
    done = asyncio.run(startup.replay(deferred, label, check, startup.exists_in({"ns/a": [{}]})))
    assert sorted(labelled) == ["n1", "n2"]
    assert checked == [("ns/a", {"v": 2}, False), ("ns/bad", {"deep": True}, True)]
    assert done == (2, 2)
    assert not deferred.nodes and not deferred.claims


def test_a_failing_label_does_not_stop_the_replay() -> None:
    deferred = startup.Deferred()
    deferred.node("bad")
    deferred.node("good")
    labelled: list[str] = []

    async def label(node: str) -> None:
        if node == "bad":
            raise RuntimeError("API down")
        labelled.append(node)

    async def check(key: str, body: dict[str, Any], rejected: bool) -> None:
        raise AssertionError("no claims")

    kopf_barrier.reset()
    asyncio.run(startup.replay(deferred, label, check, lambda _: True))
    assert labelled == ["good"]
