"""Lease leader election as a state machine: a fake clock, an in-memory Lease with resourceVersions.

Covers: first come leads, the standby waits out the lease duration (measured on
its own clock, so skew is irrelevant), a leader that cannot renew stops leading
at its renew deadline, before anyone else can take the Lease (never two leaders
at once, checked at every tick of simulated partitions and kills), a released
Lease is taken at once, optimistic concurrency lets exactly one of two racing
candidates win, and a term counter that moves on every new leadership.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from gpuplane.controller import config, leader
from testing.kubeapi import FakeApi

T = leader.Timing(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)


class Clock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class Conflict(Exception):
    pass


class Lease:
    """The API server's one Lease object: create/update with resourceVersion checks."""

    def __init__(self) -> None:
        self.record: leader.LeaseRecord | None = None
        self.version = 0
        self.writes = 0

    def _stamp(self, record: leader.LeaseRecord) -> leader.LeaseRecord:
        self.version += 1
        self.writes += 1
        self.record = dataclasses.replace(record, resource_version=str(self.version))
        return self.record


class Store:
    """One replica's connection to the Lease; ``down`` makes every call fail (a partition)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("partitioned")

    def get(self) -> leader.LeaseRecord | None:
        self._check()
        return self.lease.record

    def create(self, record: leader.LeaseRecord) -> leader.LeaseRecord:
        self._check()
        if self.lease.record is not None:
            raise Conflict("exists")
        return self.lease._stamp(record)

    def update(self, record: leader.LeaseRecord) -> leader.LeaseRecord:
        self._check()
        assert self.lease.record is not None
        if record.resource_version != self.lease.record.resource_version:
            raise Conflict("resourceVersion")
        return self.lease._stamp(record)


def replica(name: str, lease: Lease, clock: Clock, offset: float = 0.0) -> tuple[leader.Elector, Store]:
    store = Store(lease)
    elector = leader.Elector(
        name, store, T, clock=lambda: clock() + offset, wall=lambda: 1.7e9 + clock(), jitter=lambda: 0.0
    )
    return elector, store


def test_timing_must_leave_a_safety_margin() -> None:
    with pytest.raises(ValueError):
        leader.Timing(lease_duration_s=10, renew_deadline_s=10, retry_period_s=2)
    with pytest.raises(ValueError):
        leader.Timing(lease_duration_s=15, renew_deadline_s=2, retry_period_s=2)
    with pytest.raises(ValueError):  # the controller refuses the same at start
        config.parse_args(["--identity", "a", "--renew-deadline", "20"], {})


def test_first_replica_leads_the_other_stands_by() -> None:
    lease, clock = Lease(), Clock()
    a, _ = replica("a", lease, clock)
    b, _ = replica("b", lease, clock, offset=5000.0)  # another machine's monotonic clock
    assert a.try_acquire_or_renew() and a.is_leader() and a.term == 1
    assert not b.try_acquire_or_renew() and not b.is_leader() and b.holder() == "a"
    for _ in range(20):  # a renews every retry period; b keeps seeing a fresh record
        clock.now += T.retry_period_s
        assert a.step() == T.retry_period_s
        b.step()
        assert a.is_leader() and not b.is_leader()
    assert lease.record is not None and lease.record.holder == "a" and lease.record.transitions == 0
    assert a.term == 1


def test_killed_leader_is_replaced_after_the_lease_duration() -> None:
    lease, clock = Lease(), Clock()
    a, _ = replica("a", lease, clock)
    b, _ = replica("b", lease, clock, offset=-300.0)
    a.step()
    b.step()
    killed = clock.now
    took = None
    while took is None and clock.now < 60:
        clock.now += 0.5
        if not b.is_leader():
            b.try_acquire_or_renew()
            if b.is_leader():
                took = clock.now - killed
    assert took is not None and T.lease_duration_s <= took <= T.lease_duration_s + 1
    assert lease.record is not None and (lease.record.holder, lease.record.transitions) == ("b", 1)
    assert b.term == 1


def test_partitioned_leader_steps_down_before_anyone_can_take_over() -> None:
    lease, clock = Lease(), Clock()
    a, store_a = replica("a", lease, clock)
    b, _ = replica("b", lease, clock, offset=77.0)
    a.step()
    b.step()
    store_a.down = True
    lost_at = took_at = None
    for tick in itertools.count():
        clock.now = tick * 0.25
        if tick % 8 == 0:  # every 2 s both try
            a.try_acquire_or_renew()
            b.try_acquire_or_renew()
        assert not (a.is_leader() and b.is_leader()), f"two leaders at t={clock.now}"
        if lost_at is None and not a.is_leader():
            lost_at = clock.now
        if took_at is None and b.is_leader():
            took_at = clock.now
            break
    assert lost_at is not None and lost_at <= T.renew_deadline_s
    assert took_at - lost_at >= T.lease_duration_s - T.renew_deadline_s
    # The partition heals: a sees b's record and stays a standby; its next term would be 2.
    store_a.down = False
    clock.now += 2
    assert not a.try_acquire_or_renew() and not a.is_leader() and a.holder() == "b"


def test_leader_that_renews_late_keeps_the_lease_if_nobody_took_it() -> None:
    lease, clock = Lease(), Clock()
    a, store_a = replica("a", lease, clock)
    a.step()
    store_a.down = True
    clock.now = 12.0
    a.try_acquire_or_renew()
    assert not a.is_leader()  # past its renew deadline: no more writes
    store_a.down = False
    assert a.try_acquire_or_renew() and a.is_leader()
    assert a.term == 2  # a new term: caches of the first one are dropped by the runtime


def test_released_lease_is_taken_at_the_next_attempt() -> None:
    lease, clock = Lease(), Clock()
    a, _ = replica("a", lease, clock)
    b, _ = replica("b", lease, clock)
    a.step()
    b.step()
    clock.now += 1
    assert a.release() and not a.is_leader()
    assert lease.record is not None and lease.record.holder == ""
    clock.now += 0.1
    assert b.try_acquire_or_renew() and b.is_leader()
    assert not a.release()  # not the holder any more: nothing to release


def test_two_candidates_racing_for_an_expired_lease_one_wins() -> None:
    lease, clock = Lease(), Clock()
    dead, _ = replica("dead", lease, clock)
    dead.step()
    a, store_a = replica("a", lease, clock)
    b, store_b = replica("b", lease, clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    clock.now += T.lease_duration_s + 1
    # Both read the same expired record before either writes.
    seen = lease.record
    assert seen is not None
    store_a.get = lambda: seen  # type: ignore[method-assign]
    store_b.get = lambda: seen  # type: ignore[method-assign]
    results = [a.try_acquire_or_renew(), b.try_acquire_or_renew()]
    assert sorted(results) == [False, True]
    assert [a.is_leader(), b.is_leader()].count(True) == 1


def test_always_leader_for_a_single_replica() -> None:
    solo = leader.AlwaysLeader()
    assert solo.is_leader() and solo.term == 1


# --- the Lease in the API (KubeLeaseStore over the controller's client) ----------------------------------


def test_the_lease_store_writes_and_reads_the_lease_as_the_api_holds_it() -> None:
    api = FakeApi()
    store = leader.KubeLeaseStore(api, "gpuplane-system", "gpuplane-controller", 5.0)
    assert store.get() is None  # 404
    made = store.create(leader.LeaseRecord("a", 15, acquire_time=1_765_000_000.25, renew_time=1_765_000_000.25))
    assert made.holder == "a" and made.renew_time == pytest.approx(1_765_000_000.25)
    path = leader.LEASES.path("gpuplane-system", "gpuplane-controller")
    assert path == "/apis/coordination.k8s.io/v1/namespaces/gpuplane-system/leases/gpuplane-controller"
    spec = api.objects[path]["spec"]
    assert spec["renewTime"] == "2025-12-06T05:46:40.250000Z" and spec["leaseDurationSeconds"] == 15
    api.objects[path]["metadata"]["resourceVersion"] = "7"
    got = store.get()
    assert got is not None and (got.holder, got.resource_version, got.transitions) == ("a", "7", 0)
    store.update(dataclasses.replace(got, holder="", lease_duration_s=1))
    assert api.calls[-1].method == "PUT" and api.calls[-1].body["metadata"]["resourceVersion"] == "7"
    assert "holderIdentity" not in api.objects[path]["spec"]  # released
    api.objects[path] = {"metadata": {"name": "x"}, "spec": {"renewTime": "yesterday", "leaseDurationSeconds": "15"}}
    odd = store.get()  # fields of the wrong type read as absent
    assert odd is not None and (odd.holder, odd.renew_time, odd.lease_duration_s) == ("", None, 0)
