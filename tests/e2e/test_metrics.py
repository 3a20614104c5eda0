"""The driver's /metrics, scraped in e2e while real claims are prepared and unprepared.

A real driver process (simulated 8-GPU HGX H100 node) runs under its own
service-account identity (a pod-bound token, so the admission policy applies)
and publishes its ResourceSlices; the real scheduler allocates three claims
(a whole GPU, a MIG 1g.10gb device, an MPS share); the test prepares them over
the kubelet gRPC protocol, as kubelet would, and checks that the named metrics
move: prepare latency histogram counts per kind, the RPC latency histogram,
MIG instances, MPS daemons, devices published and prepared, errors by reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from e2e.cluster import handle as cluster
from e2e.plane import driverproc, install
from e2e.plane.driverproc import metric_value
from gpuplane.driver.prepare.contract import ClaimRef

pytestmark = pytest.mark.e2e

MIG_SELECTOR = 'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"'


@dataclass
class Node:
    name: str
    driver: driverproc.DriverProcess


@pytest.fixture(scope="module")
def node(control_plane: cluster.Cluster) -> Iterator[Node]:
    install.apply(control_plane)
    install.wait_established(control_plane, install.crd_names(install.render(control_plane)))
    name = f"metrics-{uuid.uuid4().hex[:5]}"
    # Every GPU's MIG placements, whatever the controller's MIG offer (docs/mig-offer.md): this driver's node is
    # no Node the controller offers MIG on, and the test allocates a MIG placement itself.
    with driverproc.published_driver(control_plane, name, "gpm-", extra_args=("--mig-placements=all",)) as driver:
        yield Node(name, driver)


def test_metrics_move_when_claims_are_prepared(control_plane: cluster.Cluster, node: Node) -> None:
    before = node.driver.scrape()
    published = metric_value(before, "gpuplane_driver_devices_published")
    assert published > 8, "8 GPUs plus their MIG placements"
    assert metric_value(before, "gpuplane_driver_devices_prepared") == 0

    suffix = uuid.uuid4().hex[:5]
    requests = {
        f"m-gpu-{suffix}": {"deviceClassName": "gpu.gpuplane.dev"},
        f"m-mig-{suffix}": {
            "deviceClassName": "mig.gpuplane.dev",
            "selectors": [{"cel": {"expression": MIG_SELECTOR}}],
        },
        f"m-mps-{suffix}": {
            "deviceClassName": "mps-silver.gpu.gpuplane.dev",
            "capacity": {"requests": {"sharePercent": "40"}},
        },
    }
    refs = []
    # The silver claim's namespace must be granted silver (tiers are entitlements, issue 32).
    control_plane.kubectl("label", "namespace", "default", "gpuplane.dev/max-tier=silver", "--overwrite")
    try:
        for name, exactly in requests.items():
            claim = driverproc.allocate_claim(control_plane.api, node.name, name, exactly)
            meta = claim["metadata"]
            refs.append(ClaimRef(meta["namespace"], meta["uid"], meta["name"]))
        with node.driver.connect() as kubelet:
            results = kubelet.prepare(refs)
            assert all(not r.error for r in results.values()), results
            during = node.driver.scrape()
            for kind in ("gpu", "mig", "mps"):
                grew = metric_value(during, "gpuplane_driver_prepare_duration_seconds_count", {"kind": kind}) - (
                    metric_value(before, "gpuplane_driver_prepare_duration_seconds_count", {"kind": kind})
                )
                assert grew == 1, f"prepare histogram for {kind}"
            assert metric_value(during, "gpuplane_driver_rpc_duration_seconds_count", {"op": "prepare"}) >= 1
            assert metric_value(during, "gpuplane_driver_mig_instances") == 1
            assert metric_value(during, "gpuplane_driver_mps_daemons") == 1
            assert metric_value(during, "gpuplane_driver_devices_prepared") == 3

            # A claim that does not exist: its error is counted by reason.
            missing = ClaimRef("default", str(uuid.uuid4()), f"missing-{suffix}")
            assert kubelet.prepare([missing])[missing.uid].error
            errors = node.driver.scrape()
            assert metric_value(errors, "gpuplane_driver_errors_total", {"op": "prepare"}) >= 1

            unprepared = kubelet.unprepare(refs)
            assert all(not r.error for r in unprepared.values()), unprepared
        after = node.driver.scrape()
        assert metric_value(after, "gpuplane_driver_rpc_duration_seconds_count", {"op": "unprepare"}) >= 1
        assert metric_value(after, "gpuplane_driver_mig_instances") == 0
        assert metric_value(after, "gpuplane_driver_mps_daemons") == 0
        assert metric_value(after, "gpuplane_driver_devices_prepared") == 0
        print(
            "\n"
            + "\n".join(
                line for line in during.splitlines() if line.startswith("gpuplane_driver_") and "_bucket" not in line
            )
        )
    finally:
        for name in requests:
            driverproc.release_claim(control_plane.api, name)
        control_plane.kubectl("label", "namespace", "default", "gpuplane.dev/max-tier-")
