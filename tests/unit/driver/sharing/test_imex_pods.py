"""The IMEX daemon in a pod of its own (:mod:`gpuplane.driver.sharing.imex_pods`, ``--imex-daemons=pod``) and the
pod's watcher (:mod:`gpuplane.driver.sharing.imex_watch`).

The pod's shape (pure); then two trays on loopback whose daemons run as "pods" (the MPS tests' ``PodKubelet``
runs each pod's command as a process) from the real stand-ins: ready through the pods, a node-file change
reaches the daemon through the watcher (``SIGUSR1``, same pid), the driver's stop leaves the pod, the next driver
adopts it (no new pod), a refused create is reported with the API's reason, the domain gone deletes the pods
and removes the files.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuplane.driver.sharing import imex_pods, imex_watch
from gpuplane.driver.sharing.mps_pods import PodTemplate
from gpuplane.driver.sharing.mps_spec import MpsError
from tests.unit.driver.sharing.test_imex_daemons import CTL, IMEX, A, B, FakeCluster, domain_obj, free_port, until
from tests.unit.driver.sharing.test_mps_pods import PodKubelet, driver_pod

REPO = Path(__file__).resolve().parents[4]


def template_for(root: Path, node: str) -> PodTemplate:
    pod = driver_pod(root, root)
    pod["spec"]["nodeName"] = node
    return PodTemplate.from_driver_pod(pod, root / "imex")


def test_the_pod_runs_the_watcher_around_the_daemon_on_the_hosts_network_with_its_directory(tmp_path: Path) -> None:
    template = template_for(tmp_path, "tray-0")
    body = imex_pods.daemon_pod(template, tmp_path / "imex", "imex-g1", "/opt/bin/nvidia-imex")
    meta, spec = body["metadata"], body["spec"]
    assert meta["name"] == imex_pods.pod_name("tray-0", "imex-g1") and meta["name"].startswith("gpuplane-imex-")
    assert meta["labels"] == {
        "app.kubernetes.io/name": "gpuplane-imex-daemon",
        "app.kubernetes.io/component": "imex-daemon",
        "gpuplane.dev/node": "tray-0",
    }
    assert meta["annotations"] == {"gpuplane.dev/imex-domain": "imex-g1"}
    assert spec["nodeName"] == "tray-0" and spec["hostNetwork"] is True and spec["restartPolicy"] == "Always"
    assert spec["automountServiceAccountToken"] is False and "hostPID" not in spec
    assert spec["volumes"] == [{"name": "imex", "hostPath": {"path": str(tmp_path / "imex"), "type": "Directory"}}]
    (container,) = spec["containers"]
    assert container["command"] == [
        "python3",
        "-m",
        "gpuplane.driver.sharing.imex_watch",
        f"--nodes={tmp_path / 'imex' / 'nodes.cfg'}",
        "--",
        "/opt/bin/nvidia-imex",
        "-c",
        str(tmp_path / "imex" / "config.cfg"),
    ]
    assert container["volumeMounts"] == [{"name": "imex", "mountPath": str(tmp_path / "imex")}]
    assert set(container["securityContext"]) == {"privileged"}  # what the pod policy admits
    assert imex_pods.pod_name("tray-1", "imex-g1") != meta["name"] != imex_pods.pod_name("tray-0", "imex-g2")
    with pytest.raises(MpsError, match="outside the driver's hostPath"):
        imex_pods.daemon_pod(template, Path("/elsewhere/imex"), "imex-g1", "nvidia-imex")


def test_a_container_that_exited_is_restarted_by_kubelet_not_the_driver() -> None:
    exited = {"status": {"phase": "Running", "containerStatuses": [{"state": {"terminated": {"exitCode": 3}}}]}}
    assert imex_pods.pod_problem(exited) is None
    looping = {
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "restartCount": 2,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 3, "reason": "Error"}},
                }
            ],
        }
    }
    assert imex_pods.pod_problem(looping) is None
    assert imex_pods.restarts_note(looping) == (
        "nvidia-imex restarted 2 time(s) by kubelet; it last exited with code 3 (Error), now CrashLoopBackOff"
    )
    stuck = {"status": {"containerStatuses": [{"state": {"waiting": {"reason": "ErrImageNeverPull", "message": "x"}}}]}}
    assert "ErrImageNeverPull" in str(imex_pods.pod_problem(stuck))
    assert "being deleted" in str(imex_pods.pod_problem({"metadata": {"deletionTimestamp": "t"}}))
    assert imex_pods.restarts_note({"status": {"containerStatuses": [{"restartCount": 0}]}}) == ""


class Kubelet(PodKubelet):
    """PodKubelet running the pod's ``python3 -m`` with this interpreter and this tree on its path."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = ""

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.refuse:
            raise RuntimeError(self.refuse)
        runnable = copy.deepcopy(dict(body))
        (container,) = runnable["spec"]["containers"]
        container["command"] = [sys.executable, *container["command"][1:]]
        container["env"] = [*container["env"], {"name": "PYTHONPATH", "value": str(REPO)}]
        return super().create_pod(namespace, runnable)


def daemon_pid(directory: Path) -> int:
    return int(json.loads((directory / "standin-record.json").read_text())["pid"])


def test_two_trays_through_pods_reload_adopt_refuse_and_stop(tmp_path: Path) -> None:
    api, kubelet, port = FakeCluster(), Kubelet(), free_port()

    def runner(node: str) -> imex_pods.ImexPodDaemons:
        root = tmp_path / node
        root.mkdir(exist_ok=True)
        return imex_pods.ImexPodDaemons(
            node,
            root / "imex",
            api.list,
            api,
            pods=kubelet,
            template=template_for(root, node),
            binary=str(IMEX),
            ctl_binary=str(CTL),
            port=port,
        )

    runners = [runner("tray-0"), runner("tray-1")]
    try:
        for r in runners:
            r.start()
            r.stop()  # only the loop: the tests tick by hand
        api.put(domain_obj({"tray-0": A, "tray-1": B}, generation=1))
        until(
            lambda: all((api.entry("imex-g1", n) or {}).get("ready") for n in ("tray-0", "tray-1")),
            "both trays ready through their pods",
            runners,  # type: ignore[arg-type]
        )
        assert sorted(p["spec"]["nodeName"] for p in kubelet.pods.values()) == ["tray-0", "tray-1"]
        one = tmp_path / "tray-0" / "imex"
        pid = daemon_pid(one)

        # a new driver on tray-0 (the old one stopped: its pod stays) adopts the pod: no new pod, same daemon
        created = len(kubelet.created)
        runners[0].stop()
        runners[0] = runner("tray-0")
        runners[0].start()
        runners[0].stop()
        for r in runners:
            r.tick()
        assert len(kubelet.created) == created and daemon_pid(one) == pid
        assert (api.entry("imex-g1", "tray-0") or {}).get("ready") is True

        # a third node joins: the node file is rewritten and the watcher sends SIGUSR1 (same daemon, reloaded)
        api.put(domain_obj({"tray-0": A, "tray-1": B, "tray-2": "127.0.0.53"}, generation=2))
        until(
            lambda: json.loads((one / "standin-record.json").read_text()).get("reloads", 0) >= 1,
            "the daemon reloaded",
            runners,  # type: ignore[arg-type]
        )
        assert daemon_pid(one) == pid and len(kubelet.created) == created
        assert (one / "nodes.cfg").read_text() == f"{A}\n{B}\n127.0.0.53\n"

        # the domain gone: every pod deleted, the files removed
        del api.objects["imex-g1"]
        for r in runners:
            r.tick()
        assert kubelet.pods == {} and not one.exists() and not (tmp_path / "tray-1" / "imex").exists()

        # a create the API refuses is reported with its reason, and tried again after the backoff
        kubelet.refuse = "403: denied by gpuplane-driver-own-node-pods"
        api.put(domain_obj({"tray-0": A, "tray-1": B}, generation=3, name="imex-g3"))
        for r in runners:
            r.tick()
        said = api.entry("imex-g3", "tray-0") or {}
        assert said.get("ready") is False and "403: denied by gpuplane-driver-own-node-pods" in said["message"], said
        assert "trying again in 1s" in said["message"]
    finally:
        kubelet.stop_all()


def test_the_watcher_signals_the_daemon_on_a_node_file_change_and_passes_sigterm(tmp_path: Path) -> None:
    assert imex_watch.should_signal(b"a\n", b"b\n") and not imex_watch.should_signal(b"a\n", b"a\n")
    assert not imex_watch.should_signal(b"a\n", None)  # a file being replaced or removed: no signal
    nodes, seen = tmp_path / "nodes.cfg", tmp_path / "signals"
    nodes.write_text("10.0.0.1\n")
    child = (
        "import signal, sys, time\n"
        f"def on(n, f): open({str(seen)!r}, 'a').write(str(n) + '\\n')\n"
        "signal.signal(signal.SIGUSR1, on)\n"
        "signal.signal(signal.SIGTERM, lambda n, f: sys.exit(7))\n"
        f"open({str(seen)!r}, 'a').write('up\\n')\n"
        "while True: time.sleep(0.05)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    watch = [sys.executable, "-m", imex_watch.__name__, f"--nodes={nodes}", "--interval=0.05", "--settle=0.2"]
    watcher = subprocess.Popen([*watch, "--", sys.executable, "-c", child], env=env)
    try:
        deadline = time.monotonic() + 20
        while "up" not in (seen.read_text() if seen.exists() else ""):
            assert time.monotonic() < deadline, "the daemon never started"
            time.sleep(0.05)
        nodes.write_text("10.0.0.1\n10.0.0.2\n")
        while str(int(signal.SIGUSR1)) not in seen.read_text():
            assert time.monotonic() < deadline, "no SIGUSR1 after the node file changed"
            time.sleep(0.05)
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(timeout=20) == 7  # the daemon's own exit code
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()


class DownApi(Kubelet):
    """The API refusing every read."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise RuntimeError("connection refused")

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        raise RuntimeError("connection refused")


def test_a_driver_starting_while_the_api_is_down_keeps_the_files_and_does_not_fail(tmp_path: Path) -> None:
    directory = tmp_path / "imex"
    directory.mkdir()
    (directory / "daemon.json").write_text(json.dumps({"domain": "imex-g1", "pod": "x", "generation": 1}))
    runner = imex_pods.ImexPodDaemons(
        "tray-0",
        directory,
        list,
        FakeCluster(),
        pods=DownApi(),
        template=template_for(tmp_path, "tray-0"),
        binary=str(IMEX),
        ctl_binary=str(CTL),
    )
    runner.start()  # logged, not raised: the driver goes on
    runner.stop()
    assert (directory / "daemon.json").exists()
