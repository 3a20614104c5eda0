"""What the informers keep of a watched object (gpuplane.controller.slim): the slice index is unchanged.

The driver's own slices (three simulated nodes, HGX and GB200) are indexed from their full bodies and
from the slimmed ones the slices stream's transform makes; the digests are equal, and the slimmed body
holds no device, no counter set and no managedFields. Through the controller's own informers (HTTP
client, list and watch) against an HTTP server, every listed or watched slice is indexed from its
slimmed form and a pod's handlers see it without managedFields.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuplane.api import boundedjson
from gpuplane.controller import caches, metrics, slim
from gpuplane.controller.node import slice_index
from gpuplane.informer.cache import Event, Informer
from gpuplane.informer.client import Client, Endpoint
from tests import indexkit

MANAGED = [{"manager": "gpuplane-driver", "operation": "Update", "fieldsV1": {"f:spec": {"f:devices": {}}}}]


@pytest.fixture(scope="module")
def slice_idx() -> Any:
    return caches.SliceIndexer(metrics.ControllerMetrics(), slice_index.Interner())


def test_the_slice_index_is_the_same_from_the_slimmed_body(slice_idx: Any, tmp_path: Path) -> None:
    raw = indexkit.fleet(tmp_path)
    slimmer = slim.Slimmer()
    for body in raw:
        name = body["metadata"]["name"]
        full = slice_idx(copy.deepcopy(body))
        cut = slimmer(
            {**copy.deepcopy(body), "metadata": {**body["metadata"], "managedFields": MANAGED}}, "ResourceSlice"
        )
        assert "devices" not in cut["spec"] and "sharedCounters" not in cut["spec"]
        assert "managedFields" not in cut["metadata"] and cut["metadata"]["name"] == name
        assert cut["spec"]["nodeName"] == body["spec"]["nodeName"] and cut["spec"]["driver"] == body["spec"]["driver"]
        assert slice_idx(cut) == full
    devices = sum(len(b["spec"].get("devices") or []) for b in raw)
    assert devices > 100  # the fleet's slices are not trivial: HGX MIG placements and GB200 GPUs


def test_the_slimmed_body_is_a_small_fraction_of_the_full_one(tmp_path: Path) -> None:
    raw = indexkit.fleet(tmp_path)
    slimmer = slim.Slimmer()
    full = sum(len(json.dumps(b)) for b in raw)
    cut = [slimmer(copy.deepcopy(b), "ResourceSlice") for b in raw]
    kept = sum(len(json.dumps({k: v for k, v in c.items() if k != slim.DIGEST})) for c in cut)
    held = sum(sys.getsizeof(c[slim.DIGEST]) for c in cut)
    assert kept + held < full / 10, (kept, held, full)


def test_one_slimmer_shares_equal_mig_devices_across_nodes(tmp_path: Path) -> None:
    """The interner is the Slimmer's: two nodes of one model hold one MIG mapping, another Slimmer its own."""
    raw = indexkit.fleet(tmp_path)
    one, other = slim.Slimmer(), slim.Slimmer()
    digests = [one(copy.deepcopy(b), "ResourceSlice")[slim.DIGEST] for b in raw]
    with_mig = [d for d in digests if d is not None and d.mig]
    first = with_mig[0]
    same = [d for d in with_mig[1:] if d.node != first.node and dict(d.mig) == dict(first.mig)]
    assert same, "the fleet has no second node publishing the same MIG placements"
    assert all(d.mig is first.mig for d in same)
    raw_first = next(b for b in raw if b["metadata"]["name"] == first.name)
    apart = other(copy.deepcopy(raw_first), "ResourceSlice")[slim.DIGEST]
    assert apart is not None and dict(apart.mig) == dict(first.mig) and apart.mig is not first.mig


def test_objects_slim_leaves_alone() -> None:
    slimmer = slim.Slimmer()
    pod = {"kind": "Pod", "metadata": {"name": "p", "managedFields": MANAGED}, "spec": {"nodeName": "n"}}
    assert slimmer(pod) == {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "n"}}
    deep = "[" * 3000 + "]" * 3000
    stub = boundedjson.decode_object(
        f'{{"kind": "ResourceSlice", "metadata": {{"name": "s"}}, "spec": {{"x": {deep}}}}}'
    )
    assert slimmer(stub) is stub and boundedjson.rejection(stub) is not None  # still refused with an Event
    other = slimmer({"kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": {"driver": "x.example.com"}})
    assert slim.digest_of(other) == (True, None)  # another driver's slice: kept out of the index
    assert slim.digest_of({"spec": {}}) == (False, None)


# --- through the controller's informers (HTTP client, paged list, watch) -----------------------------


def _slices(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for raw in indexkit.fleet(tmp):
        body = copy.deepcopy(raw)
        body["metadata"] = {**body["metadata"], "managedFields": MANAGED, "uid": body["metadata"]["name"]}
        out.append(body)
    return out


async def _via_informers(tmp: Path) -> tuple[Informer, Informer, list[Event]]:
    slices = _slices(tmp)
    pods = [{"metadata": {"name": "p", "namespace": "ns", "uid": "u", "managedFields": MANAGED}, "spec": {}}]
    stop = asyncio.Event()

    async def listing(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            for body in slices:
                obj = {**body, "kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1"}
                await response.write((json.dumps({"type": "MODIFIED", "object": obj}) + "\n").encode())
            await response.write_eof()
            return response
        listed = {"kind": "ResourceSliceList", "metadata": {"resourceVersion": "7"}, "items": slices}
        return web.Response(text=json.dumps(listed), content_type="application/json")

    async def pod_list(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            await stop.wait()  # a watch with nothing to say, until the test ends
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": pods}
        return web.Response(text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", listing)
    app.router.add_get("/api/v1/pods", pod_list)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = Client(Endpoint(f"http://127.0.0.1:{runner.addresses[0][1]}", False, lambda: None))
    streams = {s.name: s for s in caches.streams(metrics.ControllerMetrics())}
    pod_events: list[Event] = []
    slices_inf = Informer(client, streams["slices"])
    pods_inf = Informer(client, streams["pods"], [pod_events.append])
    tasks = [asyncio.create_task(i.run()) for i in (slices_inf, pods_inf)]

    async def done() -> None:
        await pods_inf.synced.wait()
        while slices_inf.counters.events < len(slices):
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(done(), timeout=30)
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await runner.cleanup()
    return slices_inf, pods_inf, pod_events


def test_the_informers_index_slimmed_slices_and_hand_on_pods_without_managed_fields(tmp_path: Path) -> None:
    """Listed and watched slices are indexed from their digests; handlers get a pod without managedFields."""
    slices_inf, _, pod_events = asyncio.run(_via_informers(tmp_path))
    index = slices_inf.indexes["slice_idx"]
    want = caches.SliceIndexer(metrics.ControllerMetrics(), slice_index.Interner())
    expected: dict[str, list[Any]] = {}
    for raw in indexkit.fleet(tmp_path):
        for node, digest in want(raw).items():
            expected.setdefault(node, []).append(digest)
    assert {n: sorted(d.name for d in index[n]) for n in index} == {
        n: sorted(d.name for d in ds) for n, ds in expected.items()
    }
    got = [d for n in index for d in index[n]]
    assert sum(len(d.gpus) for d in got) == 8 + 8 + 4
    assert slices_inf.version == "7" and slices_inf.counters.lists == 1
    assert [e.obj for e in pod_events] == [
        {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}, "kind": "Pod"}
    ]
