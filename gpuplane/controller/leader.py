"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Every replica runs the same kopf handlers and keeps its indexes (caches) warm;
only the replica that holds the Lease decides and writes. :class:`Elector` is
the state machine, one attempt per call of :meth:`Elector.step`, on an
injectable clock so the unit tests can drive it; :meth:`Elector.start` runs it
in a background thread, so a busy event loop (a long queue pass) can never
delay a renewal.

The rules are client-go's ``leaderelection`` package:

* a candidate takes the Lease when it is absent, released (no holder), or has
  not changed for ``leaseDurationSeconds`` *as observed on the candidate's own
  monotonic clock* (the times written in the Lease are informational, so clock
  skew between machines does not matter);
* every write is an update with the observed ``resourceVersion``, so of two
  replicas racing for the Lease exactly one wins;
* the holder renews every ``retry_period_s``; it counts as leader only until
  ``renew_deadline_s`` after the *start* of its last successful renewal. Since
  ``renew_deadline_s < lease_duration_s``, a holder that cannot renew stops
  deciding (at least ``lease_duration_s - renew_deadline_s`` seconds) before
  any other replica can take the Lease: no two replicas decide at once;
* on a clean shutdown the holder releases the Lease (empty holder, duration 1s)
  so a standby takes over at its next attempt instead of after the lease duration.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from gpuplane.api import boundedjson, kubetime
from gpuplane.controller import kube
from gpuplane.informer.client import ApiError, Resource

log = structlog.get_logger(__name__)
LEASES = Resource("coordination.k8s.io", "v1", "leases")

JITTER = 1.2  # client-go's JitterFactor for a candidate's retries


@dataclass(frozen=True)
class Timing:
    """client-go's three durations (defaults: 15 s, 10 s, 2 s)."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError("lease duration must exceed the renew deadline")
        if not self.renew_deadline_s > JITTER * self.retry_period_s:
            raise ValueError(f"renew deadline must exceed {JITTER} x the retry period")
        if self.retry_period_s <= 0:
            raise ValueError("retry period must be positive")


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease that election reads and writes (times in epoch seconds)."""

    holder: str  # "" when released
    lease_duration_s: int
    acquire_time: float | None = None
    renew_time: float | None = None
    transitions: int = 0
    resource_version: str = ""  # of the object this record was read from (or written as)


class LeaseStore(Protocol):
    """Reads and optimistic-concurrency writes of one Lease. Any failure raises."""

    def get(self) -> LeaseRecord | None:
        """The Lease, or None when it does not exist."""
        ...

    def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease; raises when it exists already."""
        ...

    def update(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the Lease if it is still at ``record.resource_version``; raises on a conflict."""
        ...


class Leadership(Protocol):
    """What the decision path asks: may I decide and write now, and in which term."""

    def is_leader(self) -> bool:
        """True while this replica holds the Lease and is within its renew deadline."""
        ...

    @property
    def term(self) -> int:
        """Increments every time this replica becomes leader (caches of an earlier term are stale)."""
        ...


@dataclass(frozen=True)
class AlwaysLeader:
    """Leadership of a single replica without election (``--standalone``, unit tests)."""

    term: int = 1

    def is_leader(self) -> bool:
        """Always."""
        return True


class Elector:
    """One replica's side of the election (thread-safe; all times from ``clock``)."""

    def __init__(
        self,
        identity: str,
        store: LeaseStore,
        timing: Timing = Timing(),
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        if not identity:
            raise ValueError("a replica needs a non-empty identity")
        self.identity = identity
        self.store = store
        self.timing = timing
        self._clock = clock
        self._wall = wall
        self._jitter = jitter
        self._lock = threading.Lock()
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # clock() when the observed record last changed
        self._renewed_at: float | None = None  # clock() at the start of our last successful write
        self._term = 0
        self._reported = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stepped_at: float | None = None  # clock() when the thread last finished a step

    # --- what the decision path asks --------------------------------------------------------------
    def is_leader(self) -> bool:
        """True while we hold the Lease and our last renewal started less than the renew deadline ago."""
        with self._lock:
            return self._leading(self._clock())

    @property
    def term(self) -> int:
        """Number of times this replica has become leader."""
        with self._lock:
            return self._term

    def holder(self) -> str:
        """Who holds the Lease as last observed ('' when nobody or unknown)."""
        with self._lock:
            return self._observed.holder if self._observed else ""

    def _leading(self, now: float) -> bool:
        return self._renewed_at is not None and now < self._renewed_at + self.timing.renew_deadline_s

    # --- the state machine ----------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """One attempt (client-go's tryAcquireOrRenew); True when we hold the Lease afterwards."""
        started = self._clock()
        try:
            current = self.store.get()
        except Exception as exc:  # any API failure is a failed attempt
            log.warning("could not read the leader lease", error=str(exc))
            return False
        seen = self._clock()  # a candidate measures expiry from when it saw a record change, not earlier
        now_wall = self._wall()
        if current is None:
            fresh = LeaseRecord(
                holder=self.identity,
                lease_duration_s=int(self.timing.lease_duration_s),
                acquire_time=now_wall,
                renew_time=now_wall,
            )
            try:
                written = self.store.create(fresh)
            except Exception as exc:  # lost the race to create, or the API failed
                log.info("could not create the leader lease", error=str(exc))
                return False
            self._won(written, started, new_term=True)
            return True
        with self._lock:
            if current != self._observed:
                self._observed, self._observed_at = current, seen
            mine = current.holder == self.identity
            unexpired = self._observed_at + current.lease_duration_s > seen
            if current.holder and not mine and unexpired:
                self._renewed_at = None
                return False
            new_term = not self._leading(started)
        record = dataclasses.replace(
            current,
            holder=self.identity,
            lease_duration_s=int(self.timing.lease_duration_s),
            renew_time=now_wall,
            acquire_time=current.acquire_time if mine else now_wall,
            transitions=current.transitions if mine else current.transitions + 1,
        )
        try:
            written = self.store.update(record)
        except Exception as exc:  # a conflict (someone else wrote) or an API failure
            log.info("could not write the leader lease", error=str(exc), holder=current.holder)
            return False
        self._won(written, started, new_term=new_term)
        return True

    def _won(self, written: LeaseRecord, started: float, *, new_term: bool) -> None:
        """Our write succeeded: authority counts from ``started`` (before the write), observation from now."""
        with self._lock:
            self._observed, self._observed_at = written, self._clock()
            self._renewed_at = started
            if new_term:
                self._term += 1

    def step(self) -> float:
        """One attempt, plus a log line when leadership changed; returns the delay before the next attempt."""
        self.try_acquire_or_renew()
        with self._lock:
            leading = self._leading(self._clock())
            changed = leading != self._reported
            self._reported = leading
            term, holder = self._term, self._observed.holder if self._observed else ""
        if changed and leading:
            log.info("became leader", identity=self.identity, term=term)
        elif changed:
            log.warning("stopped leading", identity=self.identity, holder=holder or None)
        if leading:
            return self.timing.retry_period_s
        return self.timing.retry_period_s * (1.0 + JITTER * self._jitter())

    def release(self) -> bool:
        """Give the Lease up if we hold it (empty holder, 1 s duration); True when released."""
        with self._lock:
            observed = self._observed
            leading = self._leading(self._clock())
            self._renewed_at = None
        if observed is None or not leading or observed.holder != self.identity:
            return False
        now_wall = self._wall()
        try:
            self.store.update(dataclasses.replace(observed, holder="", lease_duration_s=1, renew_time=now_wall))
        except Exception as exc:  # the standby then waits out the lease duration
            log.warning("could not release the leader lease", error=str(exc))
            return False
        log.info("released the leader lease", identity=self.identity)
        return True

    # --- the background thread ------------------------------------------------------------------
    def start(self) -> None:
        """Run :meth:`step` in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._stop.clear()
        with self._lock:
            self._stepped_at = self._clock()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            try:
                delay = self.step()
            except Exception:  # the loop must survive anything; the deadline fences us
                log.exception("leader election step failed")
                delay = self.timing.retry_period_s
            with self._lock:
                self._stepped_at = self._clock()

    def stalled(self) -> str | None:
        """Why the election thread is not working (for the liveness probe), or None while it is.

        A thread that never started is not stalled (``start`` may still come); one that
        has died, or whose last step finished more than two lease durations ago (a
        call that never returns), is.
        """
        thread = self._thread
        if thread is None:
            return None
        if not thread.is_alive():
            return "the leader-election thread has exited"
        with self._lock:
            stepped_at = self._stepped_at
            now = self._clock()
        limit = 2 * self.timing.lease_duration_s + self.timing.retry_period_s
        if stepped_at is not None and now - stepped_at > limit:  # stepped_at: set by start()
            return (
                f"the leader-election thread has not finished a step for {now - stepped_at:.0f}s (limit {limit:.0f}s)"
            )
        return None

    def stop(self, *, release: bool = True, timeout: float = 10.0) -> None:
        """Stop the thread, then release the Lease if we hold it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if release:
            self.release()


# --- the Lease in the API -----------------------------------------------------------------------


class KubeLeaseStore:
    """A :class:`LeaseStore` on ``coordination.k8s.io/v1``, through the controller's client (every request
    bounded by its timeout; its own event loop, so the renewer does not wait on the operator's)."""

    def __init__(self, api: kube.Api, namespace: str, name: str, request_timeout_s: float) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.timeout = request_timeout_s

    def _record(self, lease: Any) -> LeaseRecord:
        if not isinstance(lease, dict):
            raise ApiError(200, "NotALease", f"the Lease {self.namespace}/{self.name} answer is not an object")
        spec, meta = boundedjson.mapping(lease.get("spec")), boundedjson.mapping(lease.get("metadata"))
        duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
        return LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_s=duration if isinstance(duration, int) else 0,
            acquire_time=kubetime.epoch(spec.get("acquireTime")),
            renew_time=kubetime.epoch(spec.get("renewTime")),
            transitions=transitions if isinstance(transitions, int) else 0,
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record.resource_version:
            meta["resourceVersion"] = record.resource_version
        spec = {
            "holderIdentity": record.holder or None,
            "leaseDurationSeconds": record.lease_duration_s,
            "acquireTime": None if record.acquire_time is None else kubetime.rfc3339(record.acquire_time, micro=True),
            "renewTime": None if record.renew_time is None else kubetime.rfc3339(record.renew_time, micro=True),
            "leaseTransitions": record.transitions,
        }
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta}
        return {**body, "spec": {k: v for k, v in spec.items() if v is not None}}

    def get(self) -> LeaseRecord | None:
        """Read the Lease (None: 404)."""
        try:
            lease = self.api.request("GET", LEASES.path(self.namespace, self.name), timeout_s=self.timeout)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return self._record(lease)

    def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease (409 raises)."""
        body = self._body(dataclasses.replace(record, resource_version=""))
        return self._record(self.api.request("POST", LEASES.path(self.namespace), body=body, timeout_s=self.timeout))

    def update(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the Lease at ``record.resource_version`` (409 on a conflict raises)."""
        body = self._body(record)
        path = LEASES.path(self.namespace, self.name)
        return self._record(self.api.request("PUT", path, body=body, timeout_s=self.timeout))
