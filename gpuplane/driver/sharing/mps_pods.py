"""MPS control daemons in pods of their own: one Pod per MPS claim, on the driver's node.

Why: a daemon started as the driver's child lives in the driver's container, and a container
runtime kills every process of a container when it stops. A DaemonSet rollout (or any restart
of the driver pod) then killed the daemon of every live MPS claim. A daemon in its own Pod
outlives the driver pod; the next driver finds it again (through ``/proc``: both pods share the
host's PID namespace, and through its ``daemon.json``) and stops it at unprepare. NVIDIA's DRA
driver runs its MPS daemons the same way.

- :class:`PodTemplate`: what every daemon pod copies from the driver's own Pod (image, pull
  policy, runtime class, the NVIDIA runtime's environment, the hostPath volume that holds the
  MPS root, privilege), read once at start-up with :meth:`PodTemplate.from_driver_pod`;
- :func:`daemon_pod`: one claim's Pod (pure): ``<binary> -f`` with the claim's environment, the
  claim directory mounted at the same path as in the driver (the daemon's
  ``CUDA_MPS_PIPE_DIRECTORY`` is how a driver recognises it in ``/proc``) and ``shm/`` as its
  ``/dev/shm`` (the one the claim's containers get);
- :class:`DaemonPods`: the calls (create, read its state, delete and wait, list this node's).

The Pod's shape is what ``manifests/policies/driver-own-node-pods.yaml`` lets a driver create:
its own node, the component label, hostPath volumes only, no service-account token.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import structlog

from gpuplane.driver.sharing.backoff import Backoff
from gpuplane.driver.sharing.mps_spec import DaemonPaths, MpsError

log = structlog.get_logger(__name__)

APP_NAME = "gpuplane-mps-control-daemon"
COMPONENT = "mps-control-daemon"
NODE_LABEL = "gpuplane.dev/node"
CLAIM_LABEL = "gpuplane.dev/claim-uid"
CONTAINER = "mps-control-daemon"
# Copied from the driver container: how the NVIDIA container runtime is told what to inject.
RUNTIME_ENV = ("NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA", "NVIDIA_DISABLE_REQUIRE")
_LABEL_VALUE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
# Waiting reasons after which the container will not start without someone acting.
_STUCK = {
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


class PodApi(Protocol):
    """The pod calls :class:`DaemonPods` makes (:class:`gpuplane.driver.kube.KubeApi` has them)."""

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def delete_pod(self, namespace: str, name: str) -> None: ...

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class HostMount:
    """A hostPath volume of the driver pod: the host path and where the driver sees it."""

    host_path: PurePosixPath
    mount_path: PurePosixPath

    def host_of(self, path: Path) -> PurePosixPath | None:
        """The host path of ``path`` (as the driver sees it), or None when this mount does not hold it."""
        inside = PurePosixPath(path)
        try:
            rest = inside.relative_to(self.mount_path)
        except ValueError:
            return None
        return self.host_path / rest


@dataclass(frozen=True)
class PodTemplate:
    """What every daemon pod copies from the driver's own pod."""

    namespace: str
    node_name: str
    image: str
    image_pull_policy: str
    runtime_class: str | None
    env: tuple[tuple[str, str], ...]
    mount: HostMount
    privileged: bool
    priority_class: str | None

    @classmethod
    def from_driver_pod(cls, pod: Mapping[str, Any], mps_root: Path) -> PodTemplate:
        """The template from the driver's Pod; MpsError when no hostPath volume of it holds ``mps_root``
        (the MPS root, or the IMEX daemon's directory: :mod:`.imex_pods` uses the same template)."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        containers = spec.get("containers") or []
        if not containers:
            raise MpsError("the driver's own pod has no containers")
        driver = containers[0]
        host_paths: dict[str, str] = {}
        for v in spec.get("volumes") or []:
            path = (v.get("hostPath") or {}).get("path")
            if isinstance(path, str) and path:
                host_paths[str(v.get("name"))] = path
        mounts = [
            HostMount(PurePosixPath(host_paths[str(m.get("name"))]), PurePosixPath(m["mountPath"]))
            for m in driver.get("volumeMounts") or []
            if str(m.get("name")) in host_paths and m.get("mountPath")
        ]
        holding = [m for m in mounts if m.host_of(mps_root) is not None]
        if not holding:
            raise MpsError(
                f"no hostPath volume of the driver pod holds {mps_root}: mount the plugin dir from the host "
                "(the DaemonSet's plugin-dir volume), or run with --mps-daemons=process / --imex-daemons=process"
            )
        mount = max(holding, key=lambda m: len(m.mount_path.parts))  # the innermost mount wins
        wanted = [e for e in driver.get("env") or [] if e.get("name") in RUNTIME_ENV and "value" in e]
        env = tuple((str(e["name"]), str(e["value"])) for e in wanted)
        return cls(
            namespace=str(meta.get("namespace") or "gpuplane-system"),
            node_name=str(spec.get("nodeName") or ""),
            image=str(driver.get("image") or ""),
            image_pull_policy=str(driver.get("imagePullPolicy") or "IfNotPresent"),
            runtime_class=spec.get("runtimeClassName"),
            env=env,
            mount=mount,
            privileged=bool((driver.get("securityContext") or {}).get("privileged")),
            priority_class=spec.get("priorityClassName"),
        )


def pod_name(claim_uid: str) -> str:
    """``gpuplane-mps-<claim uid>``; a uid that is not a DNS label is replaced by its hash."""
    return f"gpuplane-mps-{label_value(claim_uid)}"


def label_value(claim_uid: str) -> str:
    """The claim uid when it is a valid label value (every Kubernetes uid is), else a hash of it."""
    if _LABEL_VALUE.match(claim_uid) and len(claim_uid) <= 50:
        return claim_uid
    return "h" + hashlib.sha256(claim_uid.encode()).hexdigest()[:40]


def daemon_pod(template: PodTemplate, paths: DaemonPaths, env: Mapping[str, str], binary: str) -> dict[str, Any]:
    """The Pod that runs the claim's control daemon in the foreground (pure).

    ``env`` is the daemon's environment (pipe and log dirs, CUDA_VISIBLE_DEVICES, the clients'
    priority); the claim directory is mounted at the path the driver sees it at.
    """
    host_dir = template.mount.host_of(paths.root)
    if host_dir is None:
        raise MpsError(f"claim {paths.claim_uid}: {paths.root} is outside the driver's hostPath {template.mount}")
    pod_env = {k: v for k, v in template.env}
    pod_env.update({k: v for k, v in env.items() if k != "PATH"})
    # The NVIDIA container runtime gives the daemon the claim's GPUs (MIG devices included) only.
    devices = env.get("CUDA_VISIBLE_DEVICES")
    if devices:
        pod_env["NVIDIA_VISIBLE_DEVICES"] = devices
    uid = paths.claim_uid
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": template.image,
        "imagePullPolicy": template.image_pull_policy,
        "command": [binary, "-f"],
        # Not the claim dir: runc refuses every exec (the liveness probe) whose working dir is gone,
        # so a probe run after the directory was removed would error ("unknown") instead of failing.
        "workingDir": "/",
        "env": [{"name": k, "value": v} for k, v in sorted(pod_env.items())],
        "volumeMounts": [
            {"name": "claim", "mountPath": str(paths.root)},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        # The daemon lives only as long as its claim's record: a driver that tears a claim down
        # without knowing about daemon pods (a rollback to a version before them) removes the
        # directory, and kubelet then stops the daemon (restartPolicy Never: the pod ends).
        "livenessProbe": {
            "exec": {"command": ["test", "-e", str(paths.record)]},
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 1,
        },
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": {"privileged": template.privileged},
    }
    volumes = [
        {"name": "claim", "hostPath": {"path": str(host_dir), "type": "Directory"}},
        {"name": "shm", "hostPath": {"path": str(host_dir / paths.shm.name), "type": "Directory"}},
    ]
    body = pod_skeleton(
        template,
        pod_name(uid),
        {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/component": COMPONENT, CLAIM_LABEL: label_value(uid)},
        container,
        volumes,
    )
    body["metadata"]["annotations"] = {CLAIM_LABEL: uid}
    body["spec"]["hostPID"] = True  # the driver finds and signals the daemon by its host pid
    body["spec"]["restartPolicy"] = "Never"  # a restarted daemon would come back without the claim's limits
    return body


def pod_skeleton(
    template: PodTemplate,
    name: str,
    labels: Mapping[str, str],
    container: Mapping[str, Any],
    volumes: list[dict[str, Any]],
) -> dict[str, Any]:
    """What every daemon pod of the driver is (pure; the shape ``driver-own-node-pods.yaml`` admits): pinned to
    the driver's node and labelled with it, no service-account token, the host's network (MPS speaks over UNIX
    sockets; IMEX binds the node's address), tolerating everything, the driver's priority and runtime class."""
    spec: dict[str, Any] = {
        "nodeName": template.node_name,
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "tolerations": [{"operator": "Exists"}],
        "containers": [dict(container)],
        "volumes": volumes,
    }
    if template.priority_class:
        spec["priorityClassName"] = template.priority_class
    if template.runtime_class:
        spec["runtimeClassName"] = template.runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": template.namespace,
            "labels": {**labels, NODE_LABEL: template.node_name},
        },
        "spec": spec,
    }


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why the daemon pod will not serve (ended, or stuck before its container ran); None while it may."""
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "the pod is being deleted"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "terminated" in state:
            t = state["terminated"] or {}
            return f"its container exited with code {t.get('exitCode')} ({t.get('reason') or 'no reason'})" + (
                f": {str(t['message'])[:300]}" if t.get("message") else ""
            )
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _STUCK:
            return f"its container cannot start: {waiting['reason']}: {str(waiting.get('message') or '')[:300]}"
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"the pod is {status['phase']}: {status.get('reason') or ''} {status.get('message') or ''}".strip()
    return None


class DaemonPods:
    """Creates, reads and deletes the daemon pods of one node."""

    def __init__(self, api: PodApi, template: PodTemplate, binary: str, *, delete_timeout_s: float = 30.0) -> None:
        self._api = api
        self.template = template
        self._binary = binary
        self._delete_timeout_s = delete_timeout_s

    def launch(self, paths: DaemonPaths, env: Mapping[str, str]) -> None:
        """Create the claim's daemon pod (an old one of the same name is deleted first)."""
        body = daemon_pod(self.template, paths, env, self._binary)
        name = body["metadata"]["name"]
        self.remove(paths.claim_uid)
        try:
            self._api.create_pod(self.template.namespace, body)
        except Exception as err:  # the API's refusal (admission policy, quota) is the user's next step
            raise MpsError(
                f"claim {paths.claim_uid}: cannot create MPS daemon pod {self.template.namespace}/{name}: "
                f"{api_reason(err)}"
            ) from err
        log.info("mps daemon pod created", claim_uid=paths.claim_uid, pod=name, node=self.template.node_name)

    def failure(self, claim_uid: str) -> str | None:
        """Why the claim's daemon pod will not serve, or None (running, or still starting)."""
        name = pod_name(claim_uid)
        pod = self._api.get_pod(self.template.namespace, name)
        if pod is None:
            return f"daemon pod {self.template.namespace}/{name} is gone"
        why = pod_failure(pod)
        return None if why is None else f"daemon pod {self.template.namespace}/{name}: {why}"

    def remove(self, claim_uid: str) -> None:
        """Delete the claim's daemon pod and wait until it is gone; no pod: nothing to do."""
        ns, name = self.template.namespace, pod_name(claim_uid)
        if self._api.get_pod(ns, name) is None:
            return
        if not delete_and_wait(self._api, ns, name, self._delete_timeout_s):
            raise MpsError(
                f"claim {claim_uid}: daemon pod {ns}/{name} still exists {self._delete_timeout_s:g}s after "
                "its deletion; check the node's kubelet (`kubectl describe pod -n "
                f"{ns} {name}`)"
            )
        log.info("mps daemon pod deleted", claim_uid=claim_uid, pod=name)

    def claims(self) -> dict[str, str]:
        """Claim uid -> pod name of every daemon pod on this node."""
        selector = f"app.kubernetes.io/component={COMPONENT},{NODE_LABEL}={self.template.node_name}"
        found: dict[str, str] = {}
        for pod in self._api.list_pods(self.template.namespace, selector):
            meta = pod.get("metadata") or {}
            if (pod.get("spec") or {}).get("nodeName") != self.template.node_name:
                continue  # labels are only a hint; the node is the pod's own
            uid = (meta.get("annotations") or {}).get(CLAIM_LABEL)
            if isinstance(uid, str) and uid and pod_name(uid) == meta.get("name"):
                found[uid] = str(meta["name"])
        return found


def delete_and_wait(api: PodApi, namespace: str, name: str, timeout_s: float) -> bool:
    """Delete the pod and wait until it is gone; False when it still exists after ``timeout_s``."""
    api.delete_pod(namespace, name)
    pause = Backoff(timeout_s, first_s=0.1, cap_s=1.0)
    while api.get_pod(namespace, name) is not None:
        if not pause.wait():
            return False
    return True


def api_reason(err: Exception) -> str:
    """The API server's message of a refused call (an admission policy's, a quota's), or the error."""
    body = getattr(err, "body", None)
    status = getattr(err, "status", None)
    if body:
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
        match = re.search(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
        if match:
            return f"{status}: {match.group(1)[:500]}"
    return str(err)[:500]
