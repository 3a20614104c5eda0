"""IMEX for gangs across GB200 trays (issue 35), on the session's cluster: the plan object and the channels.

The session's two ``gb200-nvl72`` trays are one clique. Gang ``wide`` (2 members x 3 GPUs) cannot sit on one
4-GPU tray, so it spans both; gang ``narrow`` (2 x 1 GPU) takes the GPU left on each. The leader writes one
``ImexDomain`` in ``gpuplane-system`` (the gangs share both trays, so one daemon per tray serves both) with a
channel >= 1 per gang, distinct; each member's CDI spec on its tray carries its own gang's channel node and
environment and never another gang's; deleting the gangs deletes the domain. Each tray's driver runs its
``nvidia-imex`` (the stand-in of ``tests/fakes``, ``--imex-daemons=process``) and reports it in its own entry
of the domain's status; a member's prepare waits until both trays say ready, and each gang is told
``ImexDomainReady``.

The channel is there because the controller holds each gang's gates until its ``ImexDomain`` lists every
member claim (``gpuplane.controller.imex.hold``): the gang's ``Placed`` Event says its gates wait for the
domain, and no member is prepared before the plan names it. A tray's driver token may write its own
node's entry of the domain's status and is refused another node's (``gpuplane-driver-own-imex-status``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from e2e.plane import identity, imex_gangs
from e2e.plane.imex_gangs import CHANNELS, gang_objects
from gpuplane.driver.sharing import imex_runner
from tests.e2e.conftest import GpuCluster, eventually
from tests.hostilekit import apply_text, ns_fixture  # noqa: F401  (fixture ns)

pytestmark = pytest.mark.e2e

SYSTEM = "gpuplane-system"


def domains(gc: GpuCluster) -> list[dict[str, Any]]:
    return list(gc.kubectl_json("get", "imexdomains", "-n", SYSTEM).get("items", []))


def running(gc: GpuCluster, ns: str, name: str, members: int) -> bool:
    return all(gc.pod(ns, f"{name}-pod-{i}")["status"].get("phase") == "Running" for i in range(members))


def cdi_imex(gc: GpuCluster, node: str, claim_uid: str) -> tuple[list[str], list[str]]:
    """The IMEX device nodes and environment of a prepared claim's CDI spec on its node."""
    (spec_file,) = [p for p in gc.node(node).cdi_root.glob("*.json") if claim_uid in p.name]
    return imex_gangs.cdi_channels(json.loads(spec_file.read_text()))


def own_entry_only(gc: GpuCluster, domain: str, trays: list[str], tmp_path: Path) -> None:
    """A tray's driver (its token, bound to a pod on the tray) writes its own status entry, never the other's.

    Through the driver's own writer (``imex_runner.StatusApi``: a merge patch of ``status.nodes``). The trays'
    drivers report their daemons in the same list meanwhile, so each write starts from the entries as read."""
    own, other = trays
    who = identity.driver_identity(gc.cluster, own, tmp_path)
    with contextlib.closing(identity.new_client(who.kubeconfig)) as api_client:
        api = imex_runner.StatusApi(api_client, SYSTEM)

        def read() -> tuple[str, list[dict[str, Any]]]:
            obj = gc.kubectl_json("get", "imexdomain", "-n", SYSTEM, domain)
            return obj["metadata"]["resourceVersion"], list(obj.get("status", {}).get("nodes", []))

        version, entries = read()
        forged = [
            e if e["node"] != other else {**e, "ready": not e["ready"], "message": "e2e: the other tray, forged"}
            for e in entries
        ]
        assert any(e["node"] == other for e in entries), entries  # the other tray's driver reported its daemon
        with pytest.raises(ApiException) as refused:
            api.patch_nodes(domain, forged, version)
        assert refused.value.status == 403
        assert "gpuplane-driver-own-imex-status" in str(refused.value.body), refused.value.body
        assert f"the gpuplane driver on node '{own}' may write only its own node's entry" in str(refused.value.body)
        print(f"[e2e] {own}'s driver writing {other}'s entry: 403 {refused.value.body}")
        with pytest.raises(ApiException) as dropped:
            api.patch_nodes(domain, [e for e in entries if e["node"] != other], version)
        assert dropped.value.status == 403  # nor remove it

        def own_write() -> bool:
            version, now = read()
            mine = {"node": own, "ready": False, "message": "e2e: written by this tray's driver token"}
            return api.patch_nodes(domain, [mine if e["node"] == own else e for e in now], version)

        assert eventually(own_write, 30, "its own entry written (a 409 when a driver wrote meanwhile: read again)")


def test_gangs_across_two_trays_get_their_own_channels_and_the_domain_goes_with_them(
    gpu_cluster: GpuCluster, ns: str, tmp_path: Path
) -> None:
    gc = gpu_cluster
    trays = sorted(n.name for n in gc.of_profile("gb200-nvl72"))
    assert len(trays) == 2, trays
    assert domains(gc) == [], "an ImexDomain before any gang"

    apply_text(gc, gang_objects(ns, "wide", 2, 3))
    eventually(lambda: running(gc, ns, "wide", 2), 180, "gang wide's members Running")
    apply_text(gc, gang_objects(ns, "narrow", 2, 1))
    eventually(lambda: running(gc, ns, "narrow", 2), 180, "gang narrow's members Running")

    uids = {g: gc.kubectl_json("get", "gpugang", "-n", ns, g)["metadata"]["uid"] for g in ("wide", "narrow")}

    def both_in_one_domain() -> dict[str, Any] | None:
        found = domains(gc)
        if len(found) != 1 or len(found[0]["spec"]["gangs"]) != 2:
            return None
        claims = sum(len(g["claims"]) for g in found[0]["spec"]["gangs"])
        return found[0] if claims == 4 else None

    obj = eventually(both_in_one_domain, 60, "one ImexDomain listing both gangs and their four claims")
    assert obj["metadata"]["name"] == f"imex-{uids['wide']}"  # the oldest gang names it
    assert obj["spec"]["nodes"] == trays
    channel = {g["name"]: g["channel"] for g in obj["spec"]["gangs"]}
    assert {g["name"]: g["uid"] for g in obj["spec"]["gangs"]} == uids
    assert channel["wide"] >= 1 and channel["narrow"] >= 1 and channel["wide"] != channel["narrow"], channel
    print(f"\n[e2e] ImexDomain {obj['metadata']['name']} on {trays}: channels {channel}")

    for gang in ("wide", "narrow"):  # the user sees why the gates were held
        said = [
            e["message"]
            for e in gc.kubectl_json("get", "events", "-n", ns, f"--field-selector=involvedObject.name={gang}")["items"]
            if e["reason"] == "Placed"
        ]
        assert any("waiting for the IMEX domain to list every member claim" in m for m in said), (gang, said)
    said = gc.kubectl_json("get", "events", "-n", ns)["items"]
    late = [e["reason"] for e in said if e["reason"].startswith("Imex") and e["type"] == "Warning"]
    assert late == [], late  # no gate lifted without the domain (ImexDomainLate, ImexRefused, ImexNotWaited)
    told = sorted({(e["involvedObject"]["name"], e["reason"]) for e in said if e["reason"] == "ImexDomainReady"})
    print(f"[e2e] ImexDomainReady told: {told}")
    assert ("wide", "ImexDomainReady") in told, told  # the daemons' readiness reached the gang

    current = gc.kubectl_json("get", "imexdomain", "-n", SYSTEM, obj["metadata"]["name"])
    entries = {e["node"]: e for e in current.get("status", {}).get("nodes", [])}
    print(f"[e2e] status.nodes: {entries}")
    assert sorted(entries) == trays and all(e["ready"] for e in entries.values()), entries  # the daemons said READY

    for gang, members in (("wide", 2), ("narrow", 2)):
        placed_on = set()
        for i in range(members):
            claim = gc.claim(ns, f"{gang}-{i}")
            (result,) = {r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]}
            placed_on.add(result)
            listed = [c for g in obj["spec"]["gangs"] for c in g["claims"] if c["uid"] == claim["metadata"]["uid"]]
            assert [(c["name"], c["node"]) for c in listed] == [(f"{gang}-{i}", result)]
            paths, env = cdi_imex(gc, result, claim["metadata"]["uid"])
            print(f"[e2e] {gang}-{i} on {result}: CDI {paths} {env}")
            assert paths == [f"{CHANNELS}{channel[gang]}"], (gang, i, paths)  # its own gang's channel, only it
            assert env == [f"GPUPLANE_IMEX_CHANNEL={channel[gang]}", f"GPUPLANE_IMEX_DOMAIN={obj['metadata']['name']}"]
        assert placed_on == set(trays), f"gang {gang} is on {placed_on}, not across both trays"

    own_entry_only(gc, obj["metadata"]["name"], trays, tmp_path)

    for gang in ("narrow", "wide"):
        gc.cluster.kubectl("delete", "gpugang", "-n", ns, gang, "--wait=true", "--timeout=60s", timeout=90)
    eventually(lambda: domains(gc) == [], 60, "the ImexDomain deleted with its gangs")
