"""The probes of the real driver and controller processes of the e2e cluster.

The module runs gpuplane as ``python -m e2e up`` does (``running_plane``: two
simulated nodes, two controller replicas) for itself and stops it at its end, not
the session's ``gpu_cluster``: a later module (``test_rbac``) needs the
controller's Lease free and re-applies the base install, which must not find
simulated nodes to schedule the controller Deployment's pods on.

Each simulated node's ``gpuplane-driver`` answers ``/healthz`` (both of its loops
passing) and ``/readyz`` (slices published, the kubelet stand-in's registration
recorded) on its metrics address; a driver whose process hangs (SIGSTOP) answers
nothing, as kubelet's probe would see it, and recovers on SIGCONT. Each
controller replica answers kopf's ``/healthz`` with the leader-election probe,
exactly one of them the leader. (A hung loop *inside* a live process turning
the answers to 503 / no answer is shown by tests/unit/driver/test_driver_probes.py and
test_controller_probes.py.)
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import handle as cluster
from e2e.cluster import procs
from e2e.plane import components
from tests.e2e.conftest import GpuCluster, eventually, running_plane

pytestmark = pytest.mark.e2e

NODES = "hgx-h100:2"


@pytest.fixture(scope="module")
def plane(control_plane: cluster.Cluster) -> Iterator[GpuCluster]:
    with running_plane(control_plane, NODES) as running:
        yield running


def get(url: str, timeout: float = 3.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_every_driver_is_live_and_ready(plane: GpuCluster) -> None:
    for node in plane.nodes:
        base = f"http://127.0.0.1:{node.metrics_port}"
        status, body = get(f"{base}/healthz")
        assert status == 200, (node.name, body)
        assert set(body) >= {"ok", "main-loop", "health-watcher"}

        def ready(url: str = f"{base}/readyz") -> dict[str, Any] | None:
            code, answer = get(url)
            return answer if code == 200 else None

        answer = eventually(ready, 30, f"{node.name} ready")
        assert answer["kubelet-registered"] == "yes" and answer["slices-published"] == "yes"


def test_a_hung_driver_process_answers_no_probe(plane: GpuCluster) -> None:
    node = plane.nodes[0]
    state_dir = plane.cluster.state_dir
    assert state_dir is not None
    record = procs.read_records(state_dir / "pids")[node.driver_process]
    url = f"http://127.0.0.1:{node.metrics_port}/healthz"
    assert get(url)[0] == 200
    os.kill(record.pid, signal.SIGSTOP)
    try:
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            get(url, timeout=2.0)
    finally:
        os.kill(record.pid, signal.SIGCONT)
    assert eventually(lambda: get(url)[0] == 200 or None, 15, "driver healthy again")


def test_every_controller_replica_answers_with_its_election(plane: GpuCluster) -> None:
    state_dir = plane.cluster.state_dir
    assert state_dir is not None
    records = components.controller_records(state_dir)
    assert len(records) >= 2
    leaders = []
    for name, record in sorted(records.items()):
        url = next(a.split("=", 1)[1] for a in record.argv if a.startswith("--liveness="))
        status, body = get(url)
        assert status == 200, (name, body)
        leaders.append(body["leader-election"]["leader"])
    assert leaders.count(True) == 1, leaders
