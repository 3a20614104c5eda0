"""``python -m e2e up --real-nodes`` (the main job's cluster) runs gpuplane as operators run it.

On the real node: the driver DaemonSet's pod and the controller Deployment's pods, from the images built
from the Dockerfiles, installed with ``kubectl apply -k`` (``e2e.plane.podinstall``); no host driver for
that node and no host controller. The simulated node keeps its host-process driver (it cannot run
containers). ``status`` says so; a second ``up`` reuses the cluster and re-applies the install without
restarting a pod; ``down`` leaves nothing behind. The commands run as a user runs them, in a process of
their own with a state directory of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import build, procs
from e2e.plane.realnode import teardown
from tests.e2e.realfixtures import skip_or_fail_without_real_nodes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
REAL, SIM = "hgx-h100-real-0", "gb200-nvl72-0"
UP = ("--nodes", "gb200-nvl72:1", "--real-nodes", "hgx-h100:1", "--addons", "")


def e2e(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "e2e", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    print(f"$ python -m e2e {' '.join(args)}  (exit {done.returncode})\n{done.stdout[-4000:]}{done.stderr[-2000:]}")
    return done


def kubectl_json(state: Path, *args: str) -> dict[str, Any]:
    kubectl = build.ensure_binaries(out=lambda _: None).kubectl
    done = subprocess.run(
        [str(kubectl), f"--kubeconfig={state / 'kubeconfig'}", *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def pods_of(state: Path, app: str) -> list[dict[str, Any]]:
    listed = kubectl_json(state, "get", "pods", "-n", "gpuplane-system", "-l", f"app.kubernetes.io/name={app}")
    return sorted(listed["items"], key=lambda p: str(p["metadata"]["name"]))


def ready(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or []
    return pod["status"].get("phase") == "Running" and bool(statuses) and all(s["ready"] for s in statuses)


def test_up_installs_gpuplane_as_pods_on_the_real_node(tmp_path: Path) -> None:
    skip_or_fail_without_real_nodes()
    state = tmp_path / "up"
    try:
        up = e2e("up", "--state-dir", str(state), *UP)
        assert up.returncode == 0
        assert "kubectl apply -k of manifests/overlays/local" in up.stdout

        (driver,) = pods_of(state, "gpuplane-driver")
        assert driver["spec"]["nodeName"] == REAL and ready(driver)
        assert driver["spec"]["containers"][0]["image"].startswith("localhost/gpuplane-driver:0.")
        controllers = pods_of(state, "gpuplane-controller")
        assert len(controllers) == 2 and all(ready(p) and p["spec"]["nodeName"] == REAL for p in controllers)
        assert all(
            p["spec"]["containers"][0]["image"].startswith("localhost/gpuplane-controller:0.") for p in controllers
        )
        lease = kubectl_json(state, "get", "lease", "-n", "gpuplane-system", "gpuplane-controller")
        assert lease["spec"]["holderIdentity"] in {p["metadata"]["name"] for p in controllers}

        records = procs.read_records(state / "pids")
        assert f"driver-{SIM}" in records and procs.is_alive(records[f"driver-{SIM}"])  # the simulated node's
        assert f"driver-{REAL}" not in records
        assert not [name for name in records if name.startswith("controller-")]
        slices = kubectl_json(state, "get", "resourceslices")["items"]
        assert {s["spec"].get("nodeName") for s in slices} >= {REAL, SIM}

        status = e2e("status", "--state-dir", str(state))
        assert status.returncode == 0
        assert "installed as pods" in status.stdout

        again = e2e("up", "--state-dir", str(state), *UP)
        assert again.returncode == 0
        assert "already running (reusing them)" in again.stdout
        assert "daemonset.apps/gpuplane-driver unchanged" in again.stdout
        assert "deployment.apps/gpuplane-controller unchanged" in again.stdout
        names = {
            p["metadata"]["uid"] for p in [*pods_of(state, "gpuplane-driver"), *pods_of(state, "gpuplane-controller")]
        }
        assert names == {p["metadata"]["uid"] for p in [driver, *controllers]}, "a pod was replaced by the re-apply"
    finally:
        down = e2e("down", "--state-dir", str(state))
    assert down.returncode == 0
    assert not (state / "install.json").exists()
    assert teardown.processes_mentioning(str(state)) == []
