"""What kopf keeps of a watched object (gpuplane.controller.slim): the slice index is unchanged, the body is not kept.

The driver's own slices (three simulated nodes, HGX and GB200) are indexed from their full bodies and
from the slimmed ones kopf_decoding hands kopf; the digests are equal, and the slimmed body holds no
device, no counter set and no managedFields. Through kopf's own list and watch code against an HTTP
server, every listed or watched slice arrives slimmed and a pod arrives without managedFields.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import auth, fetching
from kopf._cogs.configs import configuration
from kopf._cogs.structs import credentials, references

from gpuplane.api import boundedjson
from gpuplane.controller import config, handlers, kopf_decoding, slim
from tests import indexkit
from tests.kopfkit import pristine_kopf  # noqa: F401 - the fixture

MANAGED = [{"manager": "gpuplane-driver", "operation": "Update", "fieldsV1": {"f:spec": {"f:devices": {}}}}]


class Memo:
    def touched(self) -> None:
        pass


@pytest.fixture(scope="module")
def slice_idx() -> Any:
    reg = handlers.make_registry(config.parse_args(["--identity", "x"], {}))
    return {h.id: h.fn for h in reg._indexing.get_all_handlers()}["slice_idx"]


def test_the_slice_index_is_the_same_from_the_slimmed_body(slice_idx: Any, tmp_path: Path) -> None:
    raw = indexkit.fleet(tmp_path)
    slimmer = slim.Slimmer()
    for body in raw:
        name = body["metadata"]["name"]
        full = slice_idx(body=copy.deepcopy(body), name=name, namespace=None, memo=Memo())
        cut = slimmer(
            {**copy.deepcopy(body), "metadata": {**body["metadata"], "managedFields": MANAGED}}, "ResourceSlice"
        )
        assert "devices" not in cut["spec"] and "sharedCounters" not in cut["spec"]
        assert "managedFields" not in cut["metadata"] and cut["metadata"]["name"] == name
        assert cut["spec"]["nodeName"] == body["spec"]["nodeName"] and cut["spec"]["driver"] == body["spec"]["driver"]
        assert slice_idx(body=cut, name=name, namespace=None, memo=Memo()) == full
    devices = sum(len(b["spec"].get("devices") or []) for b in raw)
    assert devices > 100  # the fleet's slices are not trivial: HGX MIG placements and GB200 GPUs


def test_the_slimmed_body_is_a_small_fraction_of_the_full_one(tmp_path: Path) -> None:
    raw = indexkit.fleet(tmp_path)
    slimmer = slim.Slimmer()
    full = sum(len(json.dumps(b)) for b in raw)
    cut = [slimmer(copy.deepcopy(b), "ResourceSlice") for b in raw]
    kept = sum(len(json.dumps({k: v for k, v in c.items() if k != slim.DIGEST})) for c in cut)
    held = sum(sys.getsizeof(c[slim.DIGEST].digest) for c in cut)
    assert kept + held < full / 10, (kept, held, full)


def test_one_slimmer_shares_equal_mig_devices_across_nodes(tmp_path: Path) -> None:
    """The interner is the Slimmer's: two nodes of one model hold one MIG mapping, another Slimmer its own."""
    raw = indexkit.fleet(tmp_path)
    one, other = slim.Slimmer(), slim.Slimmer()
    digests = [one(copy.deepcopy(b), "ResourceSlice")[slim.DIGEST].digest for b in raw]
    with_mig = [d for d in digests if d is not None and d.mig]
    first = with_mig[0]
    same = [d for d in with_mig[1:] if d.node != first.node and dict(d.mig) == dict(first.mig)]
    assert same, "the fleet has no second node publishing the same MIG placements"
    assert all(d.mig is first.mig for d in same)
    raw_first = next(b for b in raw if b["metadata"]["name"] == first.name)
    apart = other(copy.deepcopy(raw_first), "ResourceSlice")[slim.DIGEST].digest
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


# --- through kopf's own list and watch code ----------------------------------------------------------


def _slices(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for raw in indexkit.fleet(tmp):
        body = copy.deepcopy(raw)
        body["metadata"] = {**body["metadata"], "managedFields": MANAGED, "uid": body["metadata"]["name"]}
        out.append(body)
    return out


async def _via_kopf(tmp: Path) -> tuple[list[Any], list[Any], list[Any]]:
    slices = _slices(tmp)
    pods = [{"metadata": {"name": "p", "namespace": "ns", "uid": "u", "managedFields": MANAGED}, "spec": {}}]

    async def listing(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            for body in slices:
                obj = {**body, "kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1"}
                await response.write((json.dumps({"type": "MODIFIED", "object": obj}) + "\n").encode())
            await response.write_eof()
            return response
        listed = {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {}, "items": slices}
        return web.Response(text=json.dumps(listed), content_type="application/json")

    async def pod_list(_: web.Request) -> web.Response:
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}
        return web.Response(text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", listing)
    app.router.add_get("/api/v1/pods", pod_list)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    vault = credentials.Vault()
    await vault.populate({"t": credentials.ConnectionInfo(server=f"http://127.0.0.1:{runner.addresses[0][1]}")})
    auth.vault_var.set(vault)
    settings = configuration.OperatorSettings()
    log = logging.getLogger("t")
    res = references.Resource(group="resource.k8s.io", version="v1", plural="resourceslices", namespaced=False)
    pod_res = references.Resource(group="", version="v1", plural="pods", namespaced=True)
    try:
        listed = [
            i
            async for chunk, _ in fetching.fetch_objs(settings=settings, resource=res, namespace=None, logger=log)
            for i in chunk
        ]
        listed_pods = [
            i
            async for chunk, _ in fetching.fetch_objs(settings=settings, resource=pod_res, namespace=None, logger=log)
            for i in chunk
        ]
        url = res.get_url(namespace=None, params={"watch": "true"})
        stream: AsyncIterator[Any] = kopf_api.stream(url=url, settings=settings, logger=log)
        watched = [e async for e in stream]
    finally:
        await runner.cleanup()
    return listed, listed_pods, watched


@pytest.mark.usefixtures("pristine_kopf")
def test_kopf_lists_and_watches_slimmed_slices(tmp_path: Path) -> None:
    kopf_decoding.install(transform=slim.Slimmer())
    listed, pods, watched = asyncio.run(_via_kopf(tmp_path))
    assert listed and len(watched) == len(listed)
    for obj in [*listed, *(e["object"] for e in watched)]:
        assert "devices" not in obj["spec"] and "managedFields" not in obj["metadata"]
        ok, digest = slim.digest_of(obj)
        assert ok and digest is not None and digest.node == obj["spec"]["nodeName"]
    got = [slim.digest_of(o)[1] for o in listed]
    assert sum(len(d.gpus) for d in got if d is not None) == 8 + 8 + 4
    assert listed[0]["kind"] == "ResourceSlice"  # kopf fills kind/apiVersion from the list as usual
    assert pods == [
        {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}, "kind": "Pod", "apiVersion": "v1"}
    ]


@pytest.mark.usefixtures("pristine_kopf")
def test_without_the_transform_kopf_keeps_the_whole_slice(tmp_path: Path) -> None:
    kopf_decoding.install()
    listed, _, watched = asyncio.run(_via_kopf(tmp_path))
    assert all(("devices" in o["spec"] or "sharedCounters" in o["spec"]) for o in listed)
    assert all("managedFields" in o["metadata"] for o in listed)
    assert all(slim.DIGEST not in e["object"] for e in watched)


def test_kopf_can_build_its_diff_base_of_a_slimmed_slice(tmp_path: Path) -> None:
    """kopf deep-copies every body for its diff base (diffbase.build); a digest holds read-only mappings."""
    from kopf._cogs.configs import diffbase
    from kopf._cogs.structs import bodies

    slimmer = slim.Slimmer()
    for raw in indexkit.fleet(tmp_path):
        cut = slimmer(copy.deepcopy(raw), "ResourceSlice")
        essence = diffbase.AnnotationsDiffBaseStorage(prefix="gpuplane.dev").build(body=bodies.Body(cut))
        assert essence[slim.DIGEST] == cut[slim.DIGEST] and slim.digest_of(copy.deepcopy(cut)) == slim.digest_of(cut)
