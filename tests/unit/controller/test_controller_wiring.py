"""Controller wiring without a cluster: config parsing, lease settings, the kopf registry, write fencing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuplane.controller import caches, config, events, handlers, kube, metrics, names, runtime, steps
from gpuplane.controller.claim import handling
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.gang import view as gang_view
from gpuplane.controller.gang import world
from gpuplane.controller.node import label_sync
from tests.controllerkit import Flag, gang_index


def test_config_reads_flags_then_environment() -> None:
    cfg = config.parse_args(["--identity", "pod-a", "--resync", "0.5"], {"GPUPLANE_EVICTION_GRACE": "0"})
    assert cfg.identity == "pod-a" and cfg.resync_s == 0.5 and cfg.eviction_grace_s == 0


def test_lease_defaults_follow_client_go_and_the_pod_namespace() -> None:
    cfg = config.parse_args(["--identity", "pod-a"], {"POD_NAMESPACE": "gpu-ops"})
    assert (cfg.lease_namespace, cfg.lease_name) == ("gpu-ops", "gpuplane-controller")
    t = cfg.lease_timing
    assert (t.lease_duration_s, t.renew_deadline_s, t.retry_period_s) == (15, 10, 2)
    assert config.parse_args(["--identity", "a"], {}).lease_namespace == "gpuplane-system"


def test_the_informers_declare_exactly_the_indexes_the_handlers_read() -> None:
    """Every index a handler reads (the World's eight, the claims' consumers, the GpuRequests' templates, and the
    steering loop's gated pods and claim templates) is declared by one stream, and no other.

    A missing one is a KeyError at the first event, an extra one a cache nobody reads."""
    declared = [name for s in caches.streams(metrics.ControllerMetrics()) for name in s.indexers]
    read_by_world = {
        "gang_idx",
        "gang_job_idx",
        "gang_lws_idx",
        "member_pod_idx",
        "claim_idx",
        "slice_idx",
        "node_idx",
        "class_idx",
    }
    assert len(declared) == len(set(declared))
    assert set(declared) == read_by_world | {
        "claim_consumer_idx",
        "template_idx",
        "pending_pod_idx",
        "claim_template_idx",
    }


class Boom:
    """An API client stand-in that fails the test if anything reaches the API (its ``request``)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"API call {name} made by a replica that is not the leader")


def test_a_replica_that_is_not_the_leader_writes_nothing() -> None:
    writer = kube.KubeWriter(Boom(), "x", guard=lambda: False)
    with pytest.raises(kube.NotLeader):
        writer.patch_gang_status("ns", "g", {"phase": "Placing"})
    with pytest.raises(kube.NotLeader):
        writer.run("ns", steps.Step("create-claim", "g-0", {}))
    with pytest.raises(kube.NotLeader):
        writer.patch_node("n", {"metadata": {}})
    with pytest.raises(kube.StepFailed):  # a wait step is not a write: it fails as before
        writer.run("ns", steps.Step("wait", "g", why="blocked"))
    writer.event(events.ObjectRef("v1", "Pod", "p", "ns", "u"), "Normal", "R", "m")  # silently dropped


def test_standby_decides_nothing_and_a_new_term_drops_the_caches() -> None:
    """The gate is ``Runtime.leading``: the writer's own fence lets every write through here, so any
    reconcile that got past the gate would reach the API (Boom) and fail the test."""
    writer = kube.KubeWriter(Boom(), "x", guard=lambda: True)
    flag = Flag()
    rt = runtime.Runtime.create(config.parse_args(["--identity", "b"], {}), writer, metrics.ControllerMetrics(), flag)
    body = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"members": 1, "gpusPerMember": 1}}
    w = world.World(gangs=gang_index([body]), pods={}, claims={}, slices=(), nodes={}, classes={})
    asyncio.run(gang_run.reconcile_gang(rt, "ns/g", w, 0.0))  # Boom would fail on any API call
    bad = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {"devices": {"config": [{"opaque": {"driver": "gpu.gpuplane.dev", "parameters": {"kind": "?"}}}]}},
    }
    asyncio.run(handling.check_claim(rt, bad, {}, ["p"]))
    node = {"metadata": {"name": "n", "uid": "n-uid", "labels": {names.NODE_LABEL_NVLINK_DOMAIN: "stale"}}}
    asyncio.run(label_sync.sync_node_label(rt, "n", node, []))
    rt.state(gang_run.GangState).overlay["ns/old"] = (0.0, {"phase": "Placing"})
    flag.leading, flag.term = True, 1
    assert rt.leading() and rt.state(gang_run.GangState).overlay == {} and rt.shared.term == 1


def test_the_write_overlay_keeps_the_placement_a_status_write_left_out() -> None:
    """Placed is written without ``placement``; a stale cached body (still Pending) must not lose it."""
    placement = {"id": "abc", "members": {"0": "n0", "1": "n1"}, "devices": {"0": "gpu-0", "1": "gpu-0"}}
    seen = gang_view.view(
        {"metadata": {"name": "g", "namespace": "ns"}, "status": {"phase": "Placing", "placement": placement}}
    )
    entry = gang_run.overlay_entry({"phase": "Placed", "reason": "GatesLifted"}, seen)
    assert entry == {"phase": "Placed", "placement": placement}
    released = {"phase": "Pending", "placement": None}
    assert gang_run.overlay_entry(released, seen) == released
    stale = gang_view.view({"metadata": {"name": "g", "namespace": "ns"}, "status": {"phase": "Pending"}})
    overlaid = world.overlay({"ns/g": stale}, {"ns/g": entry})["ns/g"]
    assert overlaid.phase == "Placed" and overlaid.status["placement"] == placement
    assert stale.phase == "Pending"  # the index entry itself is not changed


def test_kopf_watches_only_the_controllers_own_few_objects() -> None:
    """kopf keeps a worker, a memory and (for timers) the last body of every object it watches: every
    kopf handler hangs on GpuGangs or GpuRequests; the fleet-sized resources come through the informers."""
    reg = handlers.make_registry(config.parse_args(["--identity", "x"], {}))
    handlers_ = [
        *reg._spawning.get_all_handlers(),
        *reg._watching.get_all_handlers(),
        *reg._changing.get_all_handlers(),
    ]
    on = {h.selector.any_name for h in handlers_ if h.selector is not None}
    assert on == {names.GANG_PLURAL, "gpurequests"}
    assert list(reg._indexing.get_all_handlers()) == []


def test_the_explainer_looks_only_at_pending_claims_and_explains_each() -> None:
    from gpuplane.controller import indexed
    from gpuplane.controller.claim import explainer

    def entry(name: str, allocated: bool) -> indexed.ClaimView:
        status: dict[str, Any] = {"allocation": {"devices": {"results": []}}} if allocated else {}
        return indexed.claim({"metadata": {"name": name, "namespace": "ns"}, "status": status})

    index = {
        "ns/a": [entry("a", False)],
        "ns/b": [entry("b", True)],
        "ns/c": [entry("c", False)],
    }
    seen: list[str] = []
    begun: list[int] = []

    def begin() -> explainer.Explain:
        begun.append(len(seen))

        async def explain(claim: indexed.ClaimView, now: float) -> None:
            assert now > 0
            seen.append(claim.name)

        return explain

    assert asyncio.run(explainer.explain_pass(index, begin)) == 2
    assert seen == ["a", "c"] and begun == [0]  # the world is copied once per pass, not once per claim
    assert asyncio.run(explainer.explain_pass({"ns/b": [entry("b", True)]}, begin)) == 0
    assert begun == [0]  # nothing pending: no copy at all


def test_the_claim_index_keeps_what_explaining_a_pending_claim_reads() -> None:
    from gpuplane.controller import indexed

    body = {
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "uid": "u",
            "creationTimestamp": "2026-12-02T00:00:00Z",
            "annotations": {names.ANNOTATION_EXPLAINED: "no room", "other": "x"},
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}},
    }
    got = indexed.claim(body)
    assert got.created == "2026-12-02T00:00:00Z"
    assert got.annotations == {names.ANNOTATION_EXPLAINED: "no room"}
    allocated = {**body, "status": {"allocation": {"devices": {"results": []}}}}
    assert indexed.claim(allocated).created is None  # an allocated claim is never explained


def test_before_the_informers_synced_events_only_queue_work_and_after_it_each_key_runs_once() -> None:
    """Until every informer has listed, node, slice and claim events queue their keys and nothing runs (a
    leader whose every write would reach the API, Boom, writes nothing); the queues keep one entry per key
    with what the check reads of the claim, not the whole body."""
    writer = kube.KubeWriter(Boom(), "x", guard=lambda: True)
    cfg = config.parse_args(["--identity", "b"], {})
    rt = runtime.Runtime.create(cfg, writer, metrics.ControllerMetrics(), Flag(True))
    reads = handlers.make_reads(cfg, rt, None)
    node = {"metadata": {"name": "n1", "uid": "u1"}}
    claim = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "cu", "labels": {"big": "x" * 1000}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}},
        "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}], "allocation": {"devices": {}}},
    }
    seen: list[str] = []

    async def run() -> None:
        c = reads.caches
        c.informer("nodes").apply("ADDED", node)
        c.informer("nodes").apply("MODIFIED", node)
        c.informer("slices").apply(
            "ADDED", {"metadata": {"name": "s"}, "spec": {"driver": "gpu.gpuplane.dev", "nodeName": "n2"}}
        )
        c.informer("claims").apply("ADDED", claim)
        queues = [asyncio.create_task(q.run()) for q in (reads.claims, reads.labels)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert (reads.labels.done, reads.claims.done) == (0, 0) and not c.synced()
        assert len(reads.labels) == 2 and len(reads.claims) == 1
        # Kept until synced: what the review reads (identity, spec, reservations), not the whole body.
        assert reads.claims._payload["ns/c"] == (
            False,
            {
                "metadata": {"name": "c", "namespace": "ns", "uid": "cu"},
                "spec": claim["spec"],
                "status": {"reservedFor": claim["status"]["reservedFor"]},
            },
        )
        reads.labels.process = lambda key, _: _record(seen, key)
        reads.claims.process = lambda key, _: _record(seen, key)
        for informer in c.informers:
            informer.synced.set()
        await asyncio.wait_for(reads.labels.drain(), 5)
        await asyncio.wait_for(reads.claims.drain(), 5)
        for q in queues:
            q.cancel()

    asyncio.run(run())
    assert sorted(seen) == ["n1", "n2", "ns/c"]


async def _record(seen: list[str], key: str) -> None:
    seen.append(key)


def test_the_informers_and_queues_are_measured() -> None:
    """Each stream's synced flag, object count and failures, and each work queue's depth, are gauges read at scrape."""
    cfg = config.parse_args(["--identity", "m"], {})
    rt = runtime.Runtime.create(cfg, None, metrics.ControllerMetrics())  # type: ignore[arg-type]
    reads = handlers.make_reads(cfg, rt, None)
    claim = {"metadata": {"name": "c", "namespace": "ns", "uid": "cu"}, "spec": {}}
    reads.caches.informer("claims").apply("ADDED", claim)
    reads.caches.informer("claims").synced.set()
    reads.caches.informer("slices").counters.failures = 3

    def sample(name: str, **labels: str) -> float | None:
        return rt.metrics.registry.get_sample_value(name, labels)

    assert sample("gpuplane_controller_informer_synced", stream="claims") == 1.0
    assert sample("gpuplane_controller_informer_synced", stream="nodes") == 0.0
    assert sample("gpuplane_controller_informer_objects", stream="claims") == 1.0
    assert sample("gpuplane_controller_informer_failures", stream="slices") == 3.0
    assert sample("gpuplane_controller_workqueue_depth", queue="claims") == 1.0
    assert sample("gpuplane_controller_workqueue_depth", queue="gangs") == 0.0
