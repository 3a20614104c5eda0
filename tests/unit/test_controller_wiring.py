"""Controller wiring without a cluster: config parsing, lease settings, the kopf registry, write fencing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuplane.controller import config, events, handlers, kube, metrics, names, runtime
from gpuplane.controller.claim import handling
from gpuplane.controller.gang import world, writes
from tests.controllerkit import Flag


def test_config_reads_flags_then_environment() -> None:
    cfg = config.parse_args(["--identity", "pod-a", "--resync", "0.5"], {"GPUPLANE_EVICTION_GRACE": "0"})
    assert cfg.identity == "pod-a" and cfg.resync_s == 0.5 and cfg.eviction_grace_s == 0


def test_lease_defaults_follow_client_go_and_the_pod_namespace() -> None:
    cfg = config.parse_args(["--identity", "pod-a"], {"POD_NAMESPACE": "gpu-ops"})
    assert (cfg.lease_namespace, cfg.lease_name) == ("gpu-ops", "gpuplane-controller")
    t = cfg.lease_timing
    assert (t.lease_duration_s, t.renew_deadline_s, t.retry_period_s) == (15, 10, 2)
    assert config.parse_args(["--identity", "a"], {}).lease_namespace == "gpuplane-system"


def test_registry_declares_exactly_the_indexes_the_handlers_read() -> None:
    """Every index a handler reads (the World's eight, the claims' consumers, the GpuRequests' templates, and the
    steering loop's gated pods and claim templates) is declared.

    kopf passes each index to a handler as the keyword named by its id; a missing one is a KeyError
    at the first event, an extra one a cache nobody reads. kopf has no public listing of a registry's
    handlers, so this reads its indexing registry.
    """
    reg = handlers.make_registry(config.parse_args(["--identity", "x"], {}))
    ids = {h.id for h in reg._indexing.get_all_handlers()}
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
    assert ids == read_by_world | {"claim_consumer_idx", "template_idx", "pending_pod_idx", "claim_template_idx"}


class Boom:
    """An API client stand-in that fails the test if anything reaches the API."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"API call {name} made by a replica that is not the leader")


def test_a_replica_that_is_not_the_leader_writes_nothing() -> None:
    writer = kube.KubeWriter.__new__(kube.KubeWriter)
    writer.core, writer.custom, writer.component, writer.guard = Boom(), Boom(), "x", lambda: False
    with pytest.raises(kube.NotLeader):
        writer.patch_gang_status("ns", "g", {"phase": "Placing"})
    with pytest.raises(kube.NotLeader):
        writer.run("ns", writes.Step("create-claim", "g-0", {}))
    with pytest.raises(kube.NotLeader):
        writer.patch_node("n", {"metadata": {}})
    with pytest.raises(kube.StepFailed):  # a wait step is not a write: it fails as before
        writer.run("ns", writes.Step("wait", "g", why="blocked"))
    writer.event(events.ObjectRef("v1", "Pod", "p", "ns", "u"), "Normal", "R", "m")  # silently dropped


def test_standby_decides_nothing_and_a_new_term_drops_the_caches() -> None:
    """The gate is ``Runtime.leading``: the writer's own fence lets every write through here, so any
    reconcile that got past the gate would reach the API (Boom) and fail the test."""
    writer = kube.KubeWriter.__new__(kube.KubeWriter)
    writer.core, writer.custom, writer.component, writer.guard = Boom(), Boom(), "x", lambda: True
    flag = Flag()
    rt = runtime.Runtime.create(config.parse_args(["--identity", "b"], {}), writer, metrics.ControllerMetrics(), flag)
    body = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"members": 1, "gpusPerMember": 1}}
    w = world.World(gangs={"ns/g": body}, pods={}, claims={}, slices=(), nodes={}, classes={})
    asyncio.run(runtime.reconcile_gang(rt, "ns/g", w, 0.0))  # Boom would fail on any API call
    bad = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {"devices": {"config": [{"opaque": {"driver": "gpu.gpuplane.dev", "parameters": {"kind": "?"}}}]}},
    }
    asyncio.run(handling.check_claim(rt, bad, {}, ["p"]))
    node = {"metadata": {"name": "n", "uid": "n-uid", "labels": {names.NODE_LABEL_NVLINK_DOMAIN: "stale"}}}
    asyncio.run(runtime.sync_node_label(rt, "n", node, []))
    rt.shared.overlay["ns/old"] = (0.0, {"phase": "Placing"})
    flag.leading, flag.term = True, 1
    assert rt.leading() and rt.shared.overlay == {} and rt.shared.term == 1


def test_the_write_overlay_keeps_the_placement_a_status_write_left_out() -> None:
    """Placed is written without ``placement``; a stale cached body (still Pending) must not lose it."""
    placement = {"id": "abc", "members": {"0": "n0", "1": "n1"}, "devices": {"0": "gpu-0", "1": "gpu-0"}}
    seen = {"metadata": {"name": "g", "namespace": "ns"}, "status": {"phase": "Placing", "placement": placement}}
    entry = runtime.overlay_entry({"phase": "Placed", "reason": "GatesLifted"}, seen)
    assert entry == {"phase": "Placed", "placement": placement}
    released = {"phase": "Pending", "placement": None}
    assert runtime.overlay_entry(released, seen) == released
    stale = {"metadata": {"name": "g", "namespace": "ns"}, "status": {"phase": "Pending"}}
    overlaid = world.overlay({"ns/g": stale}, {"ns/g": entry})["ns/g"]
    assert overlaid["status"]["phase"] == "Placed" and overlaid["status"]["placement"] == placement


def test_no_timer_or_daemon_on_a_resource_a_fleet_has_thousands_of() -> None:
    """kopf keeps the last body of every object of a resource with a timer or daemon (its
    ``live_fresh_body``), whatever the timer's filter: a timer on claims held every claim's body
    (10,000 on a fleet). Timers and daemons hang only on the controller's own, few, objects."""
    reg = handlers.make_registry(config.parse_args(["--identity", "x"], {}))
    on = {h.selector.any_name for h in reg._spawning.get_all_handlers() if h.selector is not None}
    assert on == {names.GANG_PLURAL, "gpurequests"}


def test_the_explainer_looks_only_at_pending_claims_and_explains_each() -> None:
    from gpuplane.controller.claim import explainer

    def entry(name: str, allocated: bool) -> dict[str, Any]:
        status: dict[str, Any] = {"allocation": {"devices": {"results": []}}} if allocated else {}
        return {"metadata": {"name": name, "namespace": "ns"}, "status": status}

    index = {
        "ns/a": [entry("a", False)],
        "ns/b": [entry("b", True)],
        "ns/c": [entry("c", False)],
    }
    seen: list[str] = []
    begun: list[int] = []

    def begin() -> explainer.Explain:
        begun.append(len(seen))

        async def explain(claim: Any, now: float) -> None:
            assert now > 0
            seen.append(claim["metadata"]["name"])

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
    assert got["metadata"]["creationTimestamp"] == "2026-12-02T00:00:00Z"
    assert got["metadata"]["annotations"] == {names.ANNOTATION_EXPLAINED: "no room"}
    allocated = {**body, "status": {"allocation": {"devices": {"results": []}}}}
    assert "creationTimestamp" not in indexed.claim(allocated)["metadata"]  # an allocated claim is never explained


def test_before_kopfs_barrier_opens_node_slice_and_claim_events_defer_and_write_nothing() -> None:
    """While kopf's start-up barrier is closed (kopf_barrier), the handlers of the fleet-sized resources
    record what to do and return: a leader whose every write would reach the API (Boom) writes nothing."""
    from kopf._cogs.aiokits import aiotoggles

    from gpuplane.controller import kopf_barrier

    writer = kube.KubeWriter.__new__(kube.KubeWriter)
    writer.core, writer.custom, writer.component, writer.guard = Boom(), Boom(), "x", lambda: True
    rt = runtime.Runtime.create(
        config.parse_args(["--identity", "b"], {}), writer, metrics.ControllerMetrics(), Flag(True)
    )
    reg = handlers.make_registry(config.parse_args(["--identity", "b"], {}))
    fns = {h.id.rsplit(".", 1)[-1]: h.fn for h in reg._watching.get_all_handlers()}
    node = {"metadata": {"name": "n1", "uid": "u1"}}
    kw: dict[str, Any] = {
        "node_idx": {"n1": [{"metadata": {"name": "n1", "uid": "u1"}, "schedulable": True}]},
        "slice_idx": {},
        "claim_consumer_idx": {},
        "class_idx": {},
    }
    claim = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "cu", "labels": {"big": "x" * 1000}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}},
        "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}], "allocation": {"devices": {}}},
    }

    async def run() -> None:
        toggles = aiotoggles.ToggleSet(all)
        await toggles.make_toggle(name="not listed yet")
        kopf_barrier.reset()
        kopf_barrier._STATE.active, kopf_barrier._STATE.toggles = True, toggles
        try:
            await fns["node_event"](name="n1", type=None, memo=rt, body=node, **kw)
            slice_body = {"spec": {"driver": "gpu.gpuplane.dev", "nodeName": "n2"}}
            await fns["slice_event"](body=slice_body, memo=rt, **kw)
            await fns["claim_event"](body=claim, namespace="ns", name="c", type=None, memo=rt, **kw)
        finally:
            kopf_barrier.reset()

    asyncio.run(run())
    assert rt.shared.deferred.nodes == {"n1", "n2"}
    # Kept until the barrier opens: what the review reads (identity, spec, reservations), not the whole body.
    assert rt.shared.deferred.claims == {
        "ns/c": (
            False,
            {
                "metadata": {"name": "c", "namespace": "ns", "uid": "cu"},
                "spec": claim["spec"],
                "status": {"reservedFor": claim["status"]["reservedFor"]},
            },
        )
    }
