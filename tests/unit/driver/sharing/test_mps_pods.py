"""MPS control daemons in pods of their own (``--mps-daemons=pod``): the pod, and a daemon that outlives its driver.

The pod API here is a small in-process kubelet: creating a pod runs its container's command
(the stand-in ``nvidia-cuda-mps-control -f``) as a real process with the pod's environment and
working dir, after kubelet's own check that each hostPath volume of type Directory exists;
deleting it kills the process. The driver side (:class:`~gpuplane.driver.sharing.mps.MpsControl`
with :class:`~gpuplane.driver.sharing.mps_pods.DaemonPods`) is the production code. The real
kubelet and containerd run the same pods in ``tests/e2e/test_realnode_rollout.py``.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from gpuplane.driver.sharing import mps_pods, mps_spec
from gpuplane.driver.sharing.mps_pods import DaemonPods, PodTemplate
from tests.mpskit import (
    CLAIM_A,
    CLAIM_B,
    GIB,
    GPU,
    STANDIN,
    is_running,
    make_control,
    make_spec,
    mps_root,  # noqa: F401  (the leak-checking fixture, named root)
    standin_record,
)

REPO = Path(__file__).resolve().parents[4]
NODE = "gpu-node-1"


class PodKubelet:
    """The pod calls :class:`DaemonPods` makes, answered by running each pod's container as a process."""

    def __init__(self, *, stuck: str | None = None) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.created: list[dict[str, Any]] = []
        self.stuck = stuck  # a waiting reason the container never gets past (e.g. ErrImageNeverPull)

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        pod = copy.deepcopy(dict(body))
        name = pod["metadata"]["name"]
        assert name not in self.pods, f"pod {name} exists"
        self.created.append(copy.deepcopy(pod))
        pod["status"] = {"phase": "Pending"}
        self.pods[name] = pod
        (container,) = pod["spec"]["containers"]
        missing = [v["hostPath"]["path"] for v in pod["spec"]["volumes"] if not Path(v["hostPath"]["path"]).is_dir()]
        if self.stuck or missing:
            reason = self.stuck or "CreateContainerConfigError"
            message = f"hostPath type check failed: {missing} is not a directory" if missing else "stuck"
            pod["status"]["containerStatuses"] = [{"state": {"waiting": {"reason": reason, "message": message}}}]
            return pod
        env = {e["name"]: e["value"] for e in container["env"]}
        env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
        self.procs[name] = subprocess.Popen(
            container["command"],
            env=env,
            cwd=container["workingDir"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        pod["status"] = {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}
        return pod

    def probe(self) -> None:
        """One liveness round: a container whose exec probe fails is killed (restartPolicy Never)."""
        for name, proc in self.procs.items():
            (container,) = self.pods[name]["spec"]["containers"]
            command = container.get("livenessProbe", {}).get("exec", {}).get("command")
            if command and proc.poll() is None and subprocess.run(command, check=False).returncode != 0:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self.pods.get(name)
        proc = self.procs.get(name)
        if pod is not None and proc is not None and proc.poll() is not None:
            phase = "Succeeded" if proc.returncode == 0 else "Failed"
            pod["status"] = {
                "phase": phase,
                "containerStatuses": [{"state": {"terminated": {"exitCode": proc.returncode, "reason": "Completed"}}}],
            }
        return copy.deepcopy(pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.pods.pop(name, None)
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        wanted = dict(term.split("=", 1) for term in label_selector.split(","))
        return [
            copy.deepcopy(p)
            for p in self.pods.values()
            if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]

    def stop_all(self) -> None:
        for name in list(self.pods):
            self.delete_pod("gpuplane-system", name)


def driver_pod(mount_path: Path, host_path: Path) -> dict[str, Any]:
    """The base DaemonSet's pod template as a scheduled pod, with its plugin dir at ``host_path``."""
    docs = list(yaml.safe_load_all((REPO / "manifests/driver/daemonset.yaml").read_text()))
    (ds,) = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    template = copy.deepcopy(ds["spec"]["template"])
    pod: dict[str, Any] = {
        "metadata": {"name": "gpuplane-driver-abcde", "namespace": "gpuplane-system"},
        "spec": {**template["spec"], "nodeName": NODE},
    }
    for volume in pod["spec"]["volumes"]:
        if volume["name"] == "plugin-dir":
            volume["hostPath"]["path"] = str(host_path)
    for mount in pod["spec"]["containers"][0]["volumeMounts"]:
        if mount["name"] == "plugin-dir":
            mount["mountPath"] = str(mount_path)
    return pod


@pytest.fixture(name="kubelet")
def pod_kubelet() -> Iterator[PodKubelet]:
    k = PodKubelet()
    try:
        yield k
    finally:
        k.stop_all()


def pods_for(root: Path, kubelet: PodKubelet) -> DaemonPods:
    template = PodTemplate.from_driver_pod(driver_pod(root, root), root / "mps")
    return DaemonPods(kubelet, template, str(STANDIN), delete_timeout_s=5)


def test_the_template_is_copied_from_the_driver_pod_and_the_claim_dir_keeps_its_path() -> None:
    pod = driver_pod(Path("/var/lib/kubelet/plugins/gpu.gpuplane.dev"), Path("/srv/kubelet/plugins/gpu.gpuplane.dev"))
    template = PodTemplate.from_driver_pod(pod, Path("/var/lib/kubelet/plugins/gpu.gpuplane.dev/mps"))
    assert template.node_name == NODE and template.namespace == "gpuplane-system"
    assert template.image == "gpuplane-driver" and template.privileged
    assert template.priority_class == "system-node-critical"
    assert dict(template.env) == {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    paths = mps_spec.DaemonPaths.of(Path("/var/lib/kubelet/plugins/gpu.gpuplane.dev/mps"), CLAIM_A)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe), "CUDA_VISIBLE_DEVICES": GPU, "PATH": "/x"}
    body = mps_pods.daemon_pod(template, paths, env, "nvidia-cuda-mps-control")
    spec = body["spec"]
    (container,) = spec["containers"]
    assert body["metadata"]["name"] == f"gpuplane-mps-{CLAIM_A}"
    assert body["metadata"]["labels"] == {
        "app.kubernetes.io/name": "gpuplane-mps-control-daemon",
        "app.kubernetes.io/component": "mps-control-daemon",
        "gpuplane.dev/node": NODE,
        "gpuplane.dev/claim-uid": CLAIM_A,
    }
    assert container["command"] == ["nvidia-cuda-mps-control", "-f"] and container["workingDir"] == "/"
    got_env = {e["name"]: e["value"] for e in container["env"]}
    assert got_env["CUDA_MPS_PIPE_DIRECTORY"] == str(paths.pipe) and "PATH" not in got_env
    assert got_env["NVIDIA_VISIBLE_DEVICES"] == GPU  # the runtime injects the claim's GPUs only
    # The claim dir at the driver's path (its /proc environment is how a driver finds it), from the host's.
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes == {
        "claim": f"/srv/kubelet/plugins/gpu.gpuplane.dev/mps/{CLAIM_A}",
        "shm": f"/srv/kubelet/plugins/gpu.gpuplane.dev/mps/{CLAIM_A}/shm",
    }
    assert mounts == {"claim": str(paths.root), "shm": "/dev/shm"}
    assert spec["nodeName"] == NODE and spec["hostPID"] and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    # Tied to the claim's record: a driver that removes the claim dir without knowing the pod stops it.
    assert container["livenessProbe"]["exec"]["command"] == ["test", "-e", str(paths.record)]


def test_a_driver_without_a_host_mount_of_the_mps_root_is_told_what_to_do() -> None:
    pod = driver_pod(Path("/plugins"), Path("/plugins"))
    with pytest.raises(mps_spec.MpsError, match=r"no hostPath volume of the driver pod holds.*--mps-daemons=process"):
        PodTemplate.from_driver_pod(pod, Path("/elsewhere/mps"))


@pytest.mark.parametrize(
    ("status", "why"),
    [
        ({"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}, None),
        ({"phase": "Pending"}, None),
        ({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}, None),
        (
            {"containerStatuses": [{"state": {"waiting": {"reason": "ErrImageNeverPull", "message": "no image"}}}]},
            "cannot start: ErrImageNeverPull: no image",
        ),
        (
            {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]},
            "exited with code 3 (Error)",
        ),
        ({"phase": "Failed", "reason": "Evicted", "message": "low memory"}, "Failed: Evicted low memory"),
    ],
)
def test_pod_failure_reads_why_a_daemon_pod_will_not_serve(status: dict[str, Any], why: str | None) -> None:
    got = mps_pods.pod_failure({"metadata": {}, "status": status})
    assert got == why if why is None else (got is not None and why in got)


def test_a_claim_uid_that_is_no_label_value_is_hashed() -> None:
    assert mps_pods.label_value(CLAIM_A) == CLAIM_A
    hashed = mps_pods.label_value("Upper.Case_" + "x" * 60)
    assert hashed.startswith("h") and len(hashed) == 41
    assert mps_pods.pod_name("Upper_Case") != mps_pods.pod_name("upper_case")


def test_the_daemon_runs_in_its_pod_and_outlives_the_driver_that_started_it(root: Path, kubelet: PodKubelet) -> None:
    spec = mps_spec.MpsSpec(CLAIM_A, (GPU,), 30, {GPU: 4 * GIB}, client_priority=1)
    first = make_control(root, pods=pods_for(root, kubelet))
    daemon = first.start(spec)
    (pod,) = kubelet.created
    assert pod["metadata"]["name"] == f"gpuplane-mps-{CLAIM_A}"
    # The daemon is the pod's process, not a child of the driver.
    assert daemon.pid == kubelet.procs[pod["metadata"]["name"]].pid
    record = standin_record(daemon)
    assert record["defaults"]["active_thread_percentage"] == 30.0
    assert record["defaults"]["client_priority"] == 1

    # A new driver process (a rollout): same root, a new MpsControl; the daemon serves on.
    second = make_control(root, pods=pods_for(root, kubelet))
    assert [(d.claim_uid, d.pid) for d in second.list_daemons()] == [(CLAIM_A, daemon.pid)]
    assert second.cleanup_orphans(keep={CLAIM_A}) == []
    assert second.start(spec).pid == daemon.pid  # prepare again: the same daemon, no second pod
    assert len(kubelet.created) == 1 and is_running(daemon.pid)

    second.stop(CLAIM_A)
    assert kubelet.pods == {} and not is_running(daemon.pid)
    assert not (root / "mps" / CLAIM_A).exists()


def test_a_pod_that_cannot_start_fails_the_start_fast_and_leaves_nothing(root: Path) -> None:
    kubelet = PodKubelet(stuck="ErrImageNeverPull")
    control = make_control(root, pods=pods_for(root, kubelet), start_timeout_s=30)
    with pytest.raises(mps_spec.MpsError, match=r"did not start: daemon pod .*ErrImageNeverPull"):
        control.start(make_spec(CLAIM_A, 50, {}))
    assert len(kubelet.created) == 1 and kubelet.pods == {}
    assert not (root / "mps" / CLAIM_A).exists()


def test_orphan_daemon_pods_of_claims_no_record_keeps_are_deleted(root: Path, kubelet: PodKubelet) -> None:
    control = make_control(root, pods=pods_for(root, kubelet))
    kept = control.start(make_spec(CLAIM_A, 50, {}))
    gone = control.start(make_spec(CLAIM_B, 20, {}))
    # Another driver version unprepared B without knowing about pods: dir gone, pod left behind.
    os.killpg(gone.pid or 0, signal.SIGKILL)
    control_dir = root / "mps" / CLAIM_B
    subprocess.run(["rm", "-rf", str(control_dir)], check=True)
    assert set(kubelet.pods) == {f"gpuplane-mps-{CLAIM_A}", f"gpuplane-mps-{CLAIM_B}"}
    assert control.cleanup_orphans(keep={CLAIM_A}) == [CLAIM_B]
    assert set(kubelet.pods) == {f"gpuplane-mps-{CLAIM_A}"} and is_running(kept.pid or 0)
    control.stop(CLAIM_A)


def test_a_driver_unaware_of_daemon_pods_removing_the_claim_dir_ends_its_daemon(
    root: Path, kubelet: PodKubelet
) -> None:
    """A rollback to a version before daemon pods tears a claim down by removing its directory only."""
    control = make_control(root, pods=pods_for(root, kubelet))
    daemon = control.start(make_spec(CLAIM_A, 50, {}))
    kubelet.probe()
    assert is_running(daemon.pid or 0), "the probe passes while the claim's record exists"
    subprocess.run(["rm", "-rf", str(root / "mps" / CLAIM_A)], check=True)
    kubelet.probe()
    assert not is_running(daemon.pid or 0)
    ended = kubelet.get_pod("gpuplane-system", f"gpuplane-mps-{CLAIM_A}") or {}
    assert ended["status"]["phase"] in ("Succeeded", "Failed")  # by the daemon's exit code on SIGTERM
    assert control.cleanup_orphans(keep=set()) == [CLAIM_A] and kubelet.pods == {}


def test_pods_of_other_nodes_are_never_counted_as_this_nodes(root: Path, kubelet: PodKubelet) -> None:
    pods = pods_for(root, kubelet)
    body = mps_pods.daemon_pod(pods.template, mps_spec.DaemonPaths.of(root / "mps", CLAIM_B), {}, str(STANDIN))
    body["spec"]["nodeName"] = "another-node"  # the label says ours, the pod is not
    kubelet.pods[body["metadata"]["name"]] = body
    assert pods.claims() == {}
    assert PurePosixPath(pods.template.mount.mount_path) == PurePosixPath(root)
