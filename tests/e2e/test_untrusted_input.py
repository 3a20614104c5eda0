"""Hostile input on the real control plane: objects users can write must not crash, wedge or starve gpuplane.

Runs on the session's ``gpu_cluster`` (real drivers and two real controller
replicas under their own ServiceAccounts, see ``tests/e2e/conftest.py``); the
module sorts after ``test_rbac.py``, whose own controller needs the Lease free.

- a ResourceClaim nested 1,500 levels deep (in another driver's config, which
  gpuplane's admission policy leaves alone): both controller replicas stay up and
  healthy, the leader refuses it with an Event and fails its pod, the node driver
  answers a prepare of it with a specific per-claim error, a driver whose
  checkpoint is corrupt rebuilds past it, and gangs and claim checks go on;
- SIGTERM ends a replica at once and hands the Lease over;
- (invalid configs never holding devices: ``test_untrusted_configs.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.cluster import procs
from e2e.plane import components
from gpuplane.driver.plugin.kubelet_client import KubeletPluginClient
from gpuplane.driver.prepare.contract import ClaimRef
from tests.e2e.conftest import GpuCluster, eventually
from tests.hostile import nested, wrap
from tests.hostilekit import (
    PLACEHOLDER,
    apply_text,
    claim_body,
    events_of,
    ns_fixture,  # noqa: F401  (fixture ns)
    pod_body,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def respawned() -> Iterator[list[tuple[Any, procs.ProcessRecord]]]:
    """Processes a test started in place of the fixture's own; stopped at the end of the module."""
    started: list[tuple[Any, procs.ProcessRecord]] = []
    yield started
    for proc, record in started:
        procs.stop(record, proc)


def deep_claim_and_pod(ns: str, name: str, levels: int) -> str:
    """A List of a one-GPU claim with a config nested ``levels`` deep (for another driver) and its pod, as text."""
    params = wrap('{"apiVersion":"other.example.com/v1","kind":"Config","deep":', nested(levels), "}")
    claim = claim_body(ns, name, PLACEHOLDER)
    claim["spec"]["devices"]["config"][0]["opaque"]["driver"] = "other.example.com"
    items = [claim, pod_body(ns, name, name)]
    listing = {"apiVersion": "v1", "kind": "List", "items": items}
    return json.dumps(listing).replace(json.dumps(PLACEHOLDER), params)


def controller_records(gc: GpuCluster) -> dict[str, procs.ProcessRecord]:
    assert gc.cluster.state_dir is not None
    return components.controller_records(gc.cluster.state_dir)


def healthz(record: procs.ProcessRecord) -> int:
    url = next(a.split("=", 1)[1] for a in record.argv if a.startswith("--liveness="))
    try:
        with urllib.request.urlopen(url, timeout=2) as rsp:
            return int(rsp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def lease_holder(gc: GpuCluster) -> str:
    return components.lease_holder(gc.cluster.api)


def test_a_claim_nested_1500_deep_crashes_nothing(gpu_cluster: GpuCluster, ns: str) -> None:
    gc = gpu_cluster
    before = controller_records(gc)
    assert len(before) == 2 and all(procs.is_alive(r) for r in before.values())
    apply_text(gc, deep_claim_and_pod(ns, "deep", 1500))

    # The leader refuses the claim with an Event and the config-error annotation.
    def refused() -> dict[str, Any] | None:
        return next((e for e in events_of(gc, ns, "deep") if e["reason"] == "Rejected"), None)

    event = eventually(refused, 60, "the controller's Rejected event")
    assert "nests JSON deeper than 64 levels" in event["message"]
    assert "spec.devices.config[0].opaque.parameters.deep" in event["message"]
    assert event["source"]["component"] == "gpuplane-controller"

    # Its pod fails at once (it could never run), so nothing is held for it.
    def pod_failed() -> dict[str, Any] | None:
        pod = gc.pod(ns, "deep")
        return pod if pod["status"].get("phase") == "Failed" else None

    failed = eventually(pod_failed, 60, "the deep claim's pod to fail")
    assert (
        failed["status"]["reason"] == "InvalidDeviceConfig" and "deeper than 64 levels" in failed["status"]["message"]
    )

    # A node driver asked to prepare it (as kubelet would) answers with the specific per-claim error.
    uid = gc.cluster.kubectl("get", "resourceclaim", "-n", ns, "deep", "-o", "jsonpath={.metadata.uid}").strip()
    plugin = KubeletPluginClient(str(gc.nodes[0].plugin_dir / "dra.sock"))
    try:
        (result,) = plugin.prepare([ClaimRef(namespace=ns, uid=uid, name="deep")]).values()
    finally:
        plugin.close()
    assert "nests JSON deeper than 64 levels" in result.error and "internal error" not in result.error, result.error

    # Both replicas are alive and healthy, one holds the Lease.
    time.sleep(5)
    after = controller_records(gc)
    assert {n: r.pid for n, r in after.items()} == {n: r.pid for n, r in before.items()}
    assert all(procs.is_alive(r) for r in after.values()), "a controller replica died"
    assert [healthz(r) for r in after.values()] == [200, 200]
    assert lease_holder(gc) in {f"gpuplane-controller-{i}" for i in range(2)}

    # Claim validation still runs for everyone else: a config only the class shows wrong is flagged.
    bad = claim_body(ns, "shallow-bad", {"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "MigDeviceConfig"})
    apply_text(gc, json.dumps(bad))
    eventually(
        lambda: any(e["reason"] == "InvalidDeviceConfig" for e in events_of(gc, ns, "shallow-bad")),
        60,
        "InvalidDeviceConfig on a shallow bad claim",
    )


def test_a_gang_is_placed_while_the_deep_claim_exists(gpu_cluster: GpuCluster, ns: str) -> None:
    gc = gpu_cluster
    gang = {
        "apiVersion": "gpuplane.dev/v1alpha1",
        "kind": "GpuGang",
        "metadata": {"name": "g1", "namespace": ns},
        "spec": {"members": 1, "gpusPerMember": 1},
    }
    member = pod_body(ns, "g1-0", "g1-0")
    member["metadata"]["labels"] = {"gpuplane.dev/gang": "g1"}
    member["spec"]["schedulingGates"] = [{"name": "gpuplane.dev/gang"}]
    apply_text(gc, json.dumps({"apiVersion": "v1", "kind": "List", "items": [gang, member]}))

    def running() -> bool:
        return (gc.pod(ns, "g1-0").get("status") or {}).get("phase") == "Running"

    eventually(running, 120, "the gang member to run")
    gc.cluster.kubectl("delete", "gpugang", "-n", ns, "g1", "--wait=false")
    # The controller deletes a deleted gang's member pods itself (GangDeleted): the pod may be gone already.
    gc.cluster.kubectl("delete", "pod", "-n", ns, "g1-0", "--ignore-not-found", "--wait=true", "--timeout=60s")


def test_a_restarted_replica_starts_past_the_deep_claim_and_sigterm_hands_over(
    gpu_cluster: GpuCluster, ns: str, respawned: list[tuple[Any, procs.ProcessRecord]]
) -> None:
    gc = gpu_cluster
    records = controller_records(gc)
    leader = lease_holder(gc)
    leader_rec = records[leader.removeprefix("gpuplane-")]
    standby = next(n for n in records if f"gpuplane-{n}" != leader)
    started = time.monotonic()
    os.kill(leader_rec.pid, signal.SIGTERM)
    eventually(lambda: not procs.is_alive(leader_rec), 10, "the leader to exit on SIGTERM", step=0.1)
    exited_after = time.monotonic() - started
    load = os.getloadavg()[0]
    print(f"\n[e2e] SIGTERM -> leader exited after {exited_after:.1f}s (load {load:.1f})")
    # Seconds, not the 20 s grace nor the 15 s Lease: on a loaded 2-core machine (load ~25) it took 5.2 s.
    assert exited_after < 10.0, f"SIGTERM took {exited_after:.1f}s (load {load:.1f})"
    log = Path(leader_rec.log).read_text(errors="replace").splitlines()
    assert any('"released the leader lease"' in line for line in log[-20:])
    assert any('"code": 0' in line and '"exiting"' in line for line in log[-5:])
    eventually(lambda: lease_holder(gc) == f"gpuplane-{standby}", 10, "the standby to take the Lease")
    handover = time.monotonic() - started
    assert handover < 10.0  # released, not waited out (15 s lease)

    # The same replica started again with the deep claim still there: it runs, healthy, as the standby.
    assert gc.cluster.state_dir is not None
    proc, again = procs.spawn(
        leader_rec.name,
        leader_rec.argv,
        log=Path(leader_rec.log),
        pid_dir=gc.cluster.state_dir / "pids",
        die_with_parent=True,
    )
    respawned.append((proc, again))
    eventually(lambda: healthz(again) == 200, 30, "the restarted replica to be healthy")
    time.sleep(5)
    assert procs.is_alive(again) and healthz(again) == 200


def test_a_driver_rebuilds_its_checkpoint_past_the_deep_claim(gpu_cluster: GpuCluster, ns: str) -> None:
    gc = gpu_cluster
    node = gc.nodes[0]  # the rebuild lists every claim of the cluster: any node reads the deep one
    marker = len(Path(gc.sim.log(node.driver_process)).read_text(errors="replace").splitlines())
    # Damaged while the driver is stopped: a running driver that loads it first (a cleanup pass) moves it
    # aside, and the restarted one then finds no checkpoint and rebuilds nothing (a loaded CI run did that).
    record = gc.sim.restart(node.driver_process, while_stopped=lambda: node.checkpoint.write_text("{corrupt"))

    def recovered() -> list[str] | None:
        lines = Path(gc.sim.log(node.driver_process)).read_text(errors="replace").splitlines()[marker:]
        return lines if any('"driver ready"' in line for line in lines) else None

    lines = eventually(recovered, 60, "the driver to come back")
    assert procs.is_alive(record)
    assert any('"checkpoint corrupt' in line for line in lines)
    assert any('"ResourceClaim not readable"' in line and f"{ns}/deep" in line for line in lines)
    assert not any("RecursionError" in line for line in lines)


def test_a_replica_whose_watch_fails_releases_the_lease_and_exits(gpu_cluster: GpuCluster, ns: str) -> None:
    """The supervisor around the informers and kopf: a stream whose listing falls behind for good (each list
    outlived the API server's snapshot, ``ListingFellBehind``) ends the replica: it gives up its Lease and
    exits non-zero at once, instead of running on without that stream's objects."""
    gc = gpu_cluster
    assert gc.cluster.state_dir is not None
    lease = f"watch-failure-{uuid.uuid4().hex[:5]}"
    log = gc.cluster.state_dir / "logs" / f"{lease}.log"
    code = "\n".join(
        [
            "import asyncio, sys",
            "from gpuplane.informer import cache",
            "from gpuplane.controller import main",
            "async def behind(self):",
            "    await asyncio.sleep(3)",  # after the Lease is won
            "    raise cache.ListingFellBehind(f'listing {self.stream.name} expired 10 times in a row (this test)')",
            "cache.Informer.list_all = behind",
            "main.main(sys.argv[1:])",
        ]
    )
    argv = [
        sys.executable,
        "-c",
        code,
        f"--kubeconfig={gc.cluster.kubeconfig}",
        f"--identity={lease}",
        f"--lease-name={lease}",
        "--lease-namespace=default",
        "--liveness=",
        "--log-format=json",
    ]
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        code_ = proc.wait(timeout=120)  # the start (imports, Lease) is most of it: ~60 s at load 25
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the replica did not exit within 120 s; its log ends:\n{log.read_text(errors='replace')[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    text = log.read_text(errors="replace")
    assert code_ == 1, text[-2000:]
    assert "ListingFellBehind" in text and "expired 10 times in a row (this test)" in text  # the informers failed
    assert '"the operator failed; releasing the Lease and exiting"' in text  # the root task's end, seen at once
    assert '"became leader"' in text and '"released the leader lease"' in text, text[-2000:]
    holder = client.CoordinationV1Api(gc.cluster.api).read_namespaced_lease(lease, "default").spec.holder_identity
    assert not holder, f"the Lease is still held by {holder!r}"
    print(f"\n[e2e] informer failed -> Lease released and exit 1 after {took:.1f}s (process start included)")
