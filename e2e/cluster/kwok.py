"""KWOK (``sigs.k8s.io/kwok``): Node objects kept Ready and their pods marked Running, without kubelets.

The KWOK controller is built once from the Go module pinned in ``e2e/cluster/kwokbuild``
(``build.ensure_built``) and cached by version in ``<cache>/kwok/<version>-r<recipe>/kwok``.

``Kwok(state_dir, binary, kubeconfig).start()`` runs it as a component process (pidfile
and log in the state directory, as ``e2e.cluster.procs`` keeps them) managing every Node
labelled ``MANAGED_LABEL=MANAGED_VALUE``. Its behaviour comes from the Stage objects written
to ``state_dir/kwok/kwok.yaml`` (KWOK's own configuration format; see ``stages_yaml``):

* a managed Node that is not Ready becomes Ready (conditions, addresses, node info; the
  capacity and allocatable it was created with are kept);
* KWOK renews each managed node's Lease in ``kube-node-lease`` (every quarter of the lease
  duration, as kubelet does) and re-reports the Ready condition every few minutes;
* a pod bound to a managed node becomes Running with ready containers;
* a pod being deleted on a managed node is deleted (there is no kubelet to finish it).

KWOK talks to the API server without a client-side rate limit.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from e2e.cluster import build, procs

Printer = Callable[[str], None]

MODULE_DIR = Path(__file__).resolve().parent / "kwokbuild"
KWOK_MODULE = "sigs.k8s.io/kwok"
KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
# Bump when the way KWOK is built changes, so that a binary built the old way is rebuilt once.
RECIPE_REVISION = 1
PROCESS_NAME = "kwok"
MANAGED_LABEL = "kwok.x-k8s.io/node"
MANAGED_VALUE = "fake"
LEASE_DURATION_S = 40
"""kubelet's default node lease: renewed every 10 s."""
STATUS_REPORT_MS = 300_000
"""How often KWOK re-reports a Ready node's conditions (kubelet: ``nodeStatusReportFrequency``, 5 min)."""


def pinned_version(go_mod: Path = MODULE_DIR / "go.mod") -> str:
    """The KWOK release ``kwokbuild/go.mod`` requires, e.g. ``v0.8.0``."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(KWOK_MODULE)}\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise build.BuildError(f"{go_mod} does not require {KWOK_MODULE}")
    return match.group(1)


def ensure_kwok(
    *,
    root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    out: Printer = print,
    module_dir: Path = MODULE_DIR,
) -> Path:
    """The cached KWOK controller binary, built from the pinned module when missing (minutes the first time)."""
    env = dict(os.environ if environ is None else environ)
    version = pinned_version(module_dir / "go.mod")
    directory = (root or build.cache_root(env)) / "kwok" / f"{version}-r{RECIPE_REVISION}"
    paths = build.ensure_built(
        directory, [build.GoBinary(PROCESS_NAME, KWOK_PACKAGE)], module_dir=module_dir, environ=env, out=out
    )
    return paths[PROCESS_NAME]


_NODE_CONDITIONS = """\
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $since | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}"""


def stages_yaml(status_report_ms: int = STATUS_REPORT_MS) -> str:
    """KWOK's Stage objects for nodes and pods (written as KWOK's configuration file)."""
    ready = """\
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: {op}
      values: ['True']"""
    return f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpuplane-node-initialize
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
{ready.format(op="NotIn")}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $since := or .metadata.creationTimestamp $now }}}}
{_NODE_CONDITIONS}
      addresses:
      - {{address: {{{{ NodeIP | Quote }}}}, type: InternalIP}}
      - {{address: {{{{ .metadata.name | Quote }}}}, type: Hostname}}
      allocatable:
      {{{{ YAML .status.allocatable 1 }}}}
      capacity:
      {{{{ YAML .status.capacity 1 }}}}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        kubeProxyVersion: ""
        containerRuntimeVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        kernelVersion: ""
        osImage: gpuplane fleet (KWOK)
        bootID: ""
        machineID: ""
        systemUUID: ""
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpuplane-node-heartbeat
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: In
      values: [Running]
{ready.format(op="In")}
  delay:
    durationMilliseconds: {status_report_ms}
    jitterDurationMilliseconds: {status_report_ms + status_report_ms // 10}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $since := or .metadata.creationTimestamp $now }}}}
{_NODE_CONDITIONS}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpuplane-pod-running
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: [Pending]
{ready.format(op="NotIn")}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - {{type: Initialized, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Ready, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: ContainersReady, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      hostIP: {{{{ NodeIPWith .spec.nodeName | Quote }}}}
      phase: Running
      startTime: {{{{ $now | Quote }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpuplane-pod-delete
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: Exists
  next:
    finalizers: {{empty: true}}
    delete: true
"""


class Kwok:
    """The KWOK controller as a component process of a cluster's state directory."""

    def __init__(
        self,
        state_dir: Path,
        binary: Path,
        kubeconfig: Path,
        *,
        lease_duration_s: int = LEASE_DURATION_S,
        die_with_parent: bool = False,
        out: Printer = print,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.lease_duration_s = lease_duration_s
        self.die_with_parent = die_with_parent
        self._out = out
        self._child: tuple[subprocess.Popen[bytes], procs.ProcessRecord] | None = None

    @property
    def config_file(self) -> Path:
        """KWOK's configuration (the Stage objects)."""
        return self.state_dir / "kwok" / "kwok.yaml"

    @property
    def log(self) -> Path:
        """KWOK's log."""
        return self.state_dir / "logs" / f"{PROCESS_NAME}.log"

    @property
    def pid(self) -> int | None:
        """The running controller's pid."""
        return self._child[1].pid if self._child else None

    def argv(self) -> list[str]:
        """KWOK's command line."""
        return [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.config_file}",
            f"--manage-nodes-with-label-selector={MANAGED_LABEL}={MANAGED_VALUE}",
            f"--node-lease-duration-seconds={self.lease_duration_s}",
            "--node-ip=127.0.0.1",
            "--v=WARN",
        ]

    def start(self, settle_s: float = 2.0) -> None:
        """Write the stages, start KWOK; raise if it exits within ``settle_s`` (``fleet.wait_ready`` checks the rest).

        KWOK logs every node and pod it patches at INFO; it runs at WARN so that a fleet of
        thousands of pods does not spend its CPU on its log.
        """
        if self._child is not None:
            raise RuntimeError("KWOK already started")
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(stages_yaml())
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.unlink(missing_ok=True)
        self._child = procs.spawn(
            PROCESS_NAME,
            self.argv(),
            log=self.log,
            pid_dir=self.state_dir / "pids",
            cwd=self.state_dir,
            die_with_parent=self.die_with_parent,
        )
        proc, record = self._child
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._child = None
                raise procs.ComponentError(PROCESS_NAME, f"exited with code {proc.returncode}", record.log)
            time.sleep(0.1)
        self._out(f"KWOK started (pid {record.pid}, log {self.log})")

    def stop(self) -> None:
        """Stop KWOK (the Node objects stay; without KWOK they go NotReady after the lease expires)."""
        if self._child is None:
            return
        proc, record = self._child
        procs.stop(record, proc)
        procs.pidfile(self.state_dir / "pids", PROCESS_NAME).unlink(missing_ok=True)
        self._child = None
