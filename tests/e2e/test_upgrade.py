"""Upgrade from the N-1 manifests (v0.0.9, frozen in fixtures/) to N (manifests/) with claims prepared.

On its own control plane (so that no other test's apply of N came first):

1. ``kubectl apply -k`` the v0.0.9 manifests; a GpuGang is created under that CRD.
2. A real driver process runs on a simulated node under the driver identity and
   publishes; the real scheduler allocates three claims (whole GPU, MIG 1g.10gb,
   MPS share); they are prepared over the kubelet gRPC protocol.
3. The driver pod is stopped (what the DaemonSet's maxSurge 0 does: the old pod
   is gone before the new one starts), and its checkpoint is rewritten in the v1
   schema that a v0.0.x driver wrote (claims as a list, ``state`` for the phase,
   a ``v1`` header). The driver code itself is the current one in both phases:
   no older driver build exists, so the old checkpoint *file* stands in for it.
   The hardware state (simulated MIG instances, MPS daemons, CDI specs) is the
   one the first prepare made.
4. ``kubectl apply -k manifests/`` (N) over it: must succeed without deleting
   anything (immutable selectors unchanged); the DaemonSet strategy, version
   labels, the admission policy are now N's. CRD storage is migrated and
   ``status.storedVersions`` holds only N's storage version; the old GpuGang reads back.
5. The driver starts again (now confined by N's admission policy) and republishes.
   Every claim is still prepared: repeating NodePrepareResources returns the same
   devices and CDI ids without touching hardware, the CDI specs exist, the MIG
   instance and the MPS daemon are still counted; the checkpoint is rewritten as
   v2 on the next write; NodeUnprepareResources then releases everything.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.cluster import handle as cluster
from e2e.plane import driverproc, identity, install, nodes
from e2e.plane.driverproc import metric_value
from gpuplane.driver.prepare.contract import ClaimRef, PrepareResult
from tests.e2e.conftest import own_control_plane

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
OLD = HERE / "fixtures" / "manifests-v0.0.9"
MIG_SELECTOR = 'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"'
VERSION_LABEL = "app.kubernetes.io/version"


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    with own_control_plane(tmp_path_factory, "upgrade-plane") as handle:
        yield handle


def downgrade_checkpoint_to_v1(path: Path) -> dict[str, Any]:
    """Rewrite a v2 checkpoint file as the v1 schema wrote it; returns the v1 payload."""
    header, _, payload = path.read_bytes().partition(b"\n")
    assert b" v2 " in header, header
    raw = json.loads(payload)
    claims = []
    for uid, rec in raw["claims"].items():
        old = dict(rec)
        old["uid"] = uid
        old["state"] = old.pop("phase")
        claims.append(old)
    v1 = {"version": 1, "boot_id": raw["boot_id"], "claims": claims}
    body = json.dumps(v1).encode()
    path.write_bytes(b"gpuplane-checkpoint v1 sha256=" + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    return v1


def same_devices(a: PrepareResult, b: PrepareResult) -> bool:
    key = lambda r: sorted((d.pool_name, d.device_name, d.cdi_device_ids) for d in r.devices)  # noqa: E731
    return key(a) == key(b)


def test_upgrade_from_previous_release_keeps_prepared_claims(fresh_cluster: cluster.Cluster) -> None:
    c = fresh_cluster
    custom = client.CustomObjectsApi(c.api)
    apps = client.AppsV1Api(c.api)

    # 1. N-1 -----------------------------------------------------------------------------
    old_out = install.apply(c, OLD)
    assert "daemonset.apps/gpuplane-driver created" in old_out
    install.wait_established(c, install.crd_names(install.render(c, OLD)))
    assert (
        apps.read_namespaced_daemon_set("gpuplane-driver", "gpuplane-system").metadata.labels[VERSION_LABEL] == "0.0.9"
    )
    gang = {
        "apiVersion": "gpuplane.dev/v1alpha1",
        "kind": "GpuGang",
        "metadata": {"name": "old-gang"},
        "spec": {"members": 2, "gpusPerMember": 1},
    }
    custom.create_namespaced_custom_object("gpuplane.dev", "v1alpha1", "default", "gpugangs", gang)

    # 2. a driver and prepared claims ------------------------------------------------------
    node = f"upgrade-{uuid.uuid4().hex[:5]}"
    root = Path(tempfile.mkdtemp(prefix="gpu-"))  # short: MPS pipe paths must fit AF_UNIX
    suffix = uuid.uuid4().hex[:5]
    requests = {
        f"u-gpu-{suffix}": {"deviceClassName": "gpu.gpuplane.dev", "count": 2},
        f"u-mig-{suffix}": {
            "deviceClassName": "mig.gpuplane.dev",
            "selectors": [{"cel": {"expression": MIG_SELECTOR}}],
        },
        f"u-mps-{suffix}": {
            "deviceClassName": "mps-silver.gpu.gpuplane.dev",
            "capacity": {"requests": {"sharePercent": "40"}},
        },
    }
    with nodes.NodeHeartbeat(node, c.api, delete_on_stop=True) as beat:
        beat.wait_schedulable()
        who = identity.driver_identity(c, node, root)
        driver = driverproc.DriverProcess(node, who.kubeconfig, root)
        try:
            driver.start()
            driver.wait_published(c.api)
            refs = []
            for name, exactly in requests.items():
                claim = driverproc.allocate_claim(c.api, node, name, exactly)
                refs.append(ClaimRef("default", claim["metadata"]["uid"], name))
            with driver.connect() as kubelet:
                first = kubelet.prepare(refs)
            assert all(not r.error for r in first.values()), first
            cdi_specs = sorted(p.name for p in driver.cdi_root.iterdir())
            assert len(cdi_specs) == 3

            # 3. the old pod goes away; its checkpoint is the v1 file an old driver wrote --
            driver.stop()
            v1 = downgrade_checkpoint_to_v1(driver.checkpoint_path)
            assert {r["state"] for r in v1["claims"]} == {"PrepareCompleted"}

            # 4. N over N-1 -----------------------------------------------------------------
            new_out = install.apply(c)
            assert (
                "validatingadmissionpolicy.admissionregistration.k8s.io/gpuplane-driver-own-node-slices created"
                in new_out
            )
            assert "daemonset.apps/gpuplane-driver configured" in new_out
            ds = apps.read_namespaced_daemon_set("gpuplane-driver", "gpuplane-system")
            assert ds.metadata.labels[VERSION_LABEL] == "0.1.0"
            assert ds.spec.update_strategy.rolling_update.max_surge in (1, "1")
            assert ds.spec.update_strategy.rolling_update.max_unavailable in (0, "0")
            assert ds.spec.template.spec.containers[0].image.endswith(":0.1.0")
            crds = install.crd_names(install.render(c))
            install.wait_established(c, crds)
            ext = client.ApiextensionsV1Api(c.api)
            for name in crds:
                install.migrate_storage(c, name)
                crd = ext.read_custom_resource_definition(name)
                assert crd.status.stored_versions == [install.storage_version(crd)], name
            old_gang = custom.get_namespaced_custom_object(
                "gpuplane.dev", "v1alpha1", "default", "gpugangs", "old-gang"
            )
            assert old_gang["spec"] == {"members": 2, "gpusPerMember": 1, "tensorParallelSize": 1, "priority": 0}
            assert "PHASE" in c.kubectl("get", "gpugangs", "-n", "default").splitlines()[0]

            # 5. the new driver on the same node ---------------------------------------------
            driver.start()
            driver.wait_published(c.api)
            with driver.connect() as kubelet:
                again = kubelet.prepare(refs)
                assert all(not r.error for r in again.values()), again
                for ref in refs:
                    assert same_devices(first[ref.uid], again[ref.uid]), ref.name
                metrics = driver.scrape()
                assert metric_value(metrics, "gpuplane_driver_mig_instances") == 1
                assert metric_value(metrics, "gpuplane_driver_mps_daemons") == 1
                assert metric_value(metrics, "gpuplane_driver_devices_prepared") == 4
                # No hardware was touched again: repeated prepares are not counted as new prepares.
                assert sorted(p.name for p in driver.cdi_root.iterdir()) == cdi_specs
                for ref in refs:
                    for dev in again[ref.uid].devices:
                        assert dev.cdi_device_ids

                # Unprepare one claim: the checkpoint is written again, now as v2, the others kept.
                gpu_ref = refs[0]
                assert not kubelet.unprepare([gpu_ref])[gpu_ref.uid].error
                header, _, payload = driver.checkpoint_path.read_bytes().partition(b"\n")
                assert b" v2 " in header
                kept = json.loads(payload)["claims"]
                assert set(kept) == {r.uid for r in refs[1:]}
                assert all(rec["phase"] == "PrepareCompleted" for rec in kept.values())

                rest = kubelet.unprepare(refs[1:])
                assert all(not r.error for r in rest.values()), rest
            after = driver.scrape()
            assert metric_value(after, "gpuplane_driver_mig_instances") == 0
            assert metric_value(after, "gpuplane_driver_mps_daemons") == 0
            assert not list(driver.cdi_root.iterdir())
        finally:
            driver.stop()
            for name in requests:
                driverproc.release_claim(c.api, name)
            shutil.rmtree(root, ignore_errors=True)
