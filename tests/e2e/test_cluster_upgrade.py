"""A cluster upgrade with live claims, as operators do it: Kubernetes 1.36 -> 1.37 under gpuplane's production install.

On a control plane of this module's own, started from the 1.36 build (``releases.V1_36``: its binaries,
feature gates and API versions), with one real ``hgx-h100`` node whose kubelet is 1.36 too, gpuplane is
installed as operators install it (``kubectl apply -k``: the driver DaemonSet and the controller
Deployment from the images built from the Dockerfiles, ``installkit.installed_cluster``). Then, once:

1. Three steady pods run with a whole-GPU, a MIG 1g.10gb and an MPS claim (``rolloutkit.steady``).
2. **Control plane** 1.36.3 -> 1.37.2 in place (``ControlPlane.upgrade``: etcd, kube-apiserver,
   kube-controller-manager, kube-scheduler one at a time, same data, certificates and ports, each
   awaited before the next). The steady pods must be undisturbed and gpuplane's own pods not restarted.
3. **Kubelet** 1.36.3 -> 1.37.2 in place on the node (``RealNodes.upgrade_kubelet``: stop, the new
   release's feature gates, the new build; no drain), while pods with claims of every kind keep being
   created and deleted (``rolloutkit.Churn``: its first claims run on a 1.37 control plane with the
   1.36 kubelet, the version skew of an upgrade in progress). Every churn pod must run, no prepare or
   unprepare may fail, and the steady pods must keep the same container (no restart), the same devices,
   CDI ids and MIG instance, and the same MPS control daemon process: nothing is prepared twice.
4. New claims of every kind on the upgraded cluster.
5. **The driver's own rolling upgrade on the new release** (``kubectl rollout restart`` of the
   DaemonSet: the seamless ``maxSurge: 1`` update) under churn, as in step 3.

After steps 3 and 5 nothing may be left on the node that no steady claim owns (checkpoint records,
CDI specs, MIG instances, MPS daemons: ``rolloutkit.leaks``). The figures are printed as one table.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator

import pytest

from e2e.cluster import build, controlplane, releases
from e2e.cluster import handle as cluster
from e2e.plane import realinstall
from tests.e2e import rolloutkit
from tests.e2e.conftest import eventually
from tests.e2e.installkit import Install, installed_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

OLD, NEW = releases.V1_36, releases.V1_37
NODES = "hgx-h100:1"
SETTLE_S = 10.0
"""Churn runs this long before the kubelet or the driver is replaced (claims prepared on the old one)."""
SOAK_S = 20.0
"""Churn goes on this long after the replacement is up (claims prepared on the new one alone)."""


@dataclasses.dataclass
class Step:
    """What one step of the upgrade did to the claims."""

    what: str
    seconds: float
    figures: rolloutkit.Figures = dataclasses.field(default_factory=rolloutkit.Figures)
    disrupted: list[str] = dataclasses.field(default_factory=list)
    daemons_replaced: list[str] = dataclasses.field(default_factory=list)
    leaks: list[str] = dataclasses.field(default_factory=list)
    churn_errors: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Run:
    """The upgrade's record."""

    install: Install
    versions: dict[str, tuple[str, str]]  # what -> (before, after)
    outage: dict[str, float]  # control-plane component -> seconds from its stop until it served again
    system_restarts: dict[str, int]  # gpuplane-system pod -> restarts during the control-plane upgrade
    steady: list[rolloutkit.SteadyPod]
    after: list[rolloutkit.SteadyPod]
    steps: list[Step]

    def step(self, what: str) -> Step:
        return next(s for s in self.steps if s.what == what)


def _server_version(install: Install) -> str:
    return str(json.loads(install.kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"])


def _kubelet_version(install: Install) -> str:
    node = install.kubectl_json("get", "node", install.nodes[0].name)
    return str(node["status"]["nodeInfo"]["kubeletVersion"])


def _system_pods(install: Install) -> dict[str, tuple[str, int]]:
    """gpuplane-system's pods: name -> (uid, restarts summed over containers)."""
    pods = install.kubectl_json("get", "pods", "-n", realinstall.NAMESPACE)["items"]
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(int(c.get("restartCount", 0)) for c in p["status"].get("containerStatuses") or []),
        )
        for p in pods
        if not p["metadata"]["name"].startswith("mps-")  # per-claim MPS daemon pods come and go with claims
    }


def _under_churn(install: Install, what: str, replace: Callable[[], None], keep: list[rolloutkit.SteadyPod]) -> Step:
    """Churn through ``replace()`` and ``SOAK_S`` after it; the steady pods checked, then leaks."""
    with rolloutkit.Churn(install, tag=what) as churn:
        time.sleep(SETTLE_S)
        began = time.monotonic()
        replace()
        install.wait_rolled_out()
        step = Step(what, time.monotonic() - began)
        time.sleep(SOAK_S)
        step.figures = churn.stop()
        step.churn_errors = list(churn.errors)
    step.disrupted, step.daemons_replaced = rolloutkit.disruptions(install, keep)
    try:
        eventually(lambda: rolloutkit.leaks(install, keep) == [], 120.0, f"{what}: churn state cleaned up")
    except AssertionError:
        step.leaks = rolloutkit.leaks(install, keep)
    install.say(
        f"{what}: {step.seconds:.1f}s; {step.figures.line()}; disrupted steady pods {len(step.disrupted)}; "
        f"MPS daemons replaced {len(step.daemons_replaced)}; leaks {len(step.leaks)}"
    )
    for line in step.figures.failed_events + step.figures.not_running + step.disrupted + step.daemons_replaced:
        install.say(f"  {line}")
    for line in step.leaks + step.churn_errors:
        install.say(f"  {line}")
    return step


def _rollout_restart(install: Install) -> Callable[[], None]:
    def restart() -> None:
        before, began = {p["metadata"]["uid"] for p in install.driver_pods()}, time.monotonic()
        install.kubectl("rollout", "restart", "-n", realinstall.NAMESPACE, f"daemonset/{realinstall.DAEMONSET}")
        rolloutkit.wait_driver_replaced(install, "the driver DaemonSet's restart", before, began)

    return restart


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    if releases.RUNNING is not NEW:
        pytest.skip(f"upgrades {OLD.minor} -> {NEW.minor}; this run is on {releases.RUNNING.minor}")
    old_bins = build.ensure_binaries(module_dir=OLD.module_dir)
    new_bins = build.ensure_binaries(module_dir=NEW.module_dir)
    state_dir = tmp_path_factory.mktemp("k8s-upgrade")
    plane = controlplane.ControlPlane(
        state_dir,
        old_bins,
        feature_gates=OLD.feature_gates,
        runtime_config=OLD.runtime_config,
        die_with_parent=True,
    )
    try:
        handle = cluster.Cluster.connect(plane.start(), old_bins, state_dir=state_dir)
        try:
            with installed_cluster(handle, NODES, release=OLD) as install:
                install.kubectl("create", "namespace", rolloutkit.NS)
                before = {"kube-apiserver": _server_version(install), "kubelet": _kubelet_version(install)}
                steady = rolloutkit.steady(install, "steady")
                install.say(f"steady claims on {OLD.minor}: {[(p.name, p.devices, p.mps_pids) for p in steady]}")

                system = _system_pods(install)
                began = time.monotonic()
                outage = plane.upgrade(new_bins, feature_gates=NEW.feature_gates, runtime_config=NEW.runtime_config)
                handle.bins = new_bins  # kubectl of the new release from here on
                cp_seconds = time.monotonic() - began
                install.wait_rolled_out()
                now = _system_pods(install)
                restarts = {n: now[n][1] - r for n, (uid, r) in system.items() if n in now and now[n][0] == uid}
                restarts |= {n: -1 for n in system if n not in now or now[n][0] != system[n][0]}  # -1: pod replaced
                cp = Step("control plane", cp_seconds)
                cp.disrupted, cp.daemons_replaced = rolloutkit.disruptions(install, steady)
                install.say(
                    f"control plane {OLD.minor} -> {NEW.minor}: {cp_seconds:.1f}s (outage per component, s: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in outage.items())
                    + f"); gpuplane-system restarts {restarts}; disrupted steady pods {len(cp.disrupted)}"
                )

                node = install.nodes[0]
                upgraded: dict[str, float] = {}

                def upgrade_kubelet() -> None:
                    upgraded["seconds"] = install.real.real.upgrade_kubelet(node, NEW)

                kubelet = _under_churn(install, "kubelet", upgrade_kubelet, steady)
                install.say(
                    f"kubelet {OLD.minor} -> {NEW.minor}: Ready at the new version in {upgraded['seconds']:.1f}s"
                )
                after = rolloutkit.steady(install, "after")
                install.say(f"new claims on {NEW.minor}: {[(p.name, p.devices) for p in after]}")
                driver = _under_churn(install, "driver", _rollout_restart(install), steady + after)
                versions = {
                    "kube-apiserver": (before["kube-apiserver"], _server_version(install)),
                    "kubelet": (before["kubelet"], _kubelet_version(install)),
                }
                yield Run(install, versions, outage, restarts, steady, after, [cp, kubelet, driver])
                for pod in steady + after:
                    install.kubectl(
                        "delete", "pod,resourceclaim", "-n", rolloutkit.NS, pod.name, "--wait=true", timeout=180
                    )
        finally:
            handle.close()
    finally:
        plane.stop()


def test_versions_are_the_new_release(run: Run) -> None:
    want = build.read_pins(NEW.module_dir / "go.mod").kubernetes
    old = build.read_pins(OLD.module_dir / "go.mod").kubernetes
    assert run.versions == {"kube-apiserver": (old, want), "kubelet": (old, want)}


def test_control_plane_upgrade_disturbs_no_pod(run: Run) -> None:
    cp = run.step("control plane")
    assert set(run.outage) == set(controlplane.COMPONENTS)
    assert cp.disrupted == [] and cp.daemons_replaced == []
    assert run.system_restarts and all(n == 0 for n in run.system_restarts.values()), run.system_restarts


@pytest.mark.parametrize("what", ["kubelet", "driver"])
def test_claims_prepared_throughout_and_steady_pods_keep_their_devices(run: Run, what: str) -> None:
    step = run.step(what)
    assert step.churn_errors == []
    assert step.figures.not_running == [] and step.figures.failed_events == []
    assert set(step.figures.by_kind) == set(rolloutkit.KINDS), step.figures.by_kind
    assert step.disrupted == [] and step.daemons_replaced == []
    assert step.leaks == []


def test_new_claims_of_every_kind_after_the_upgrade(run: Run) -> None:
    assert sorted(p.kind for p in run.after) == sorted(rolloutkit.KINDS)
    assert all(p.devices and all(cdi for _, cdi, _ in p.devices) for p in run.after), run.after
    mig = next(p for p in run.after if p.kind == "mig")
    assert all(uuid and uuid.startswith("MIG-") for _, _, uuid in mig.devices), mig.devices


def test_figures(run: Run) -> None:
    """The table for the record (docs/kubernetes-versions.md)."""
    lines = [f"upgrade {OLD.minor} -> {NEW.minor}, one real hgx-h100 node, gpuplane installed by kubectl apply -k"]
    lines += [f"  {what}: {a} -> {b}" for what, (a, b) in run.versions.items()]
    lines += [f"  control-plane outage {k}: {v:.1f}s" for k, v in run.outage.items()]
    for step in run.steps:
        f = step.figures
        lines.append(
            f"  {step.what}: {step.seconds:.1f}s, claims prepared during it {f.prepared} {f.by_kind}, "
            f"not running {len(f.not_running)}, failed prepares {len(f.failed_events)}, steady pods "
            f"disrupted {len(step.disrupted)} of {len(run.steady) + (len(run.after) if step.what == 'driver' else 0)}, "
            f"leaks {len(step.leaks)}"
        )
    print("\n".join(lines))
    assert len(run.steps) == 3 and all(s.seconds > 0 for s in run.steps)
