"""Upgrades an operator can trust, on a real node: N-1 -> N, N -> N (seamless), N -> N-1, with live claims.

N-1 is a real earlier version: the pinned commit ``previous.PREVIOUS`` of this
repository, exported with ``git archive`` and built from its own Dockerfiles, installed
from its own ``manifests/overlays/local`` (``e2e.images.previous``,
``tests/e2e/installkit.py``). On one real ``hgx-h100`` node (a real kubelet v1.36 and
containerd) of a control plane of this module's own, the fixture runs, once:

1. N-1 is installed; three steady pods run with a whole-GPU, a MIG 1g.10gb and an MPS
   claim.
2. N-1 -> N: ``kubectl apply -k`` of N while pods with claims of each kind keep being
   created and deleted (``rolloutkit.Churn``). Where N-1's images and objects are N's
   (nothing that goes into them changed since the pinned commit) the apply must change
   nothing: the same driver pod serves on, and the test says so.
3. N -> N (``kubectl rollout restart``): the seamless rolling update of N itself
   (``maxSurge: 1, maxUnavailable: 0``): the new pod registers beside the old one (the
   registry dir holds both sockets, each carrying its pod UID) before the old one stops.
4. N -> N-1 (rollback, ``kubectl apply -k`` of N-1's overlay), like step 2.

Each rollout is measured: claims prepared during it, failed prepares (0), pods that did
not run, disrupted steady pods (0: same pod, same container, zero restarts, same
devices, CDI ids and MIG instance), rollout time, the most plugin sockets at once; then
no MIG instance, MPS daemon dir or pod, or CDI spec is left that no steady claim owns.

MPS: N runs each claim's control daemon in a pod of its own (``--mps-daemons=pod``), so a
steady MPS claim prepared by N keeps the same daemon process through N -> N and N -> N-1
(a second steady MPS pod, made once N runs, is checked for that:
``test_steady_mps_daemon_survives_the_rollouts``). N-1 (``previous.PREVIOUS``) ran daemons as
its own children, in its container: N-1 -> N stops them with N-1's pod, as that version did on
every restart; the test reports it (``N1_DAEMONS_DIE``) and does not count it against N.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from e2e.images import previous
from e2e.plane import realinstall, realinstall_compat
from tests.e2e import rolloutkit
from tests.e2e.conftest import eventually, own_control_plane
from tests.e2e.installkit import REPO, Install, installed_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

NODES = "hgx-h100:1"
PREVIOUS_ENV = "GPUPLANE_E2E_PREVIOUS"
"""Another commit to install as N-1 (default ``previous.PREVIOUS``); one older than
``realinstall_compat.FIXED_IN`` gets that module's patches."""
SOAK_S = 20.0
"""Churn goes on this long after a rollout completes (prepares through the new pod alone)."""
N1_DAEMONS_DIE = (
    "N-1 started each claim's MPS control daemon as a child in its own container; containerd kills every "
    "process of that container when N-1's pod stops, so N-1 -> N ends the daemons N-1 started"
)


@dataclasses.dataclass
class Step:
    """One rollout's figures and findings."""

    what: str
    rolled: bool  # False: the apply changed no pod (N-1's images and objects are N's)
    seconds: float = 0.0
    most_sockets: int = 0
    figures: rolloutkit.Figures = dataclasses.field(default_factory=rolloutkit.Figures)
    disrupted: list[str] = dataclasses.field(default_factory=list)
    daemons: list[str] = dataclasses.field(default_factory=list)
    leaks: list[str] = dataclasses.field(default_factory=list)
    sockets_after: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Run:
    """What the fixture saw: N-1's commit, whether it differs from N, every step."""

    commit: str
    same_as_n: bool
    seamless_n1: bool  # N-1 has UID socket names and maxSurge 1 (a rollback to it is seamless too)
    steady: list[rolloutkit.SteadyPod]
    steady_n: list[rolloutkit.SteadyPod]  # made once N runs: its MPS daemon is one of N's pods
    steps: list[Step]
    install: Install


def _roll(
    install: Install, what: str, apply: Callable[[], object], steady: list[rolloutkit.SteadyPod], rolls: bool
) -> Step:
    """Churn during ``apply()`` and ``SOAK_S`` after it; record the figures."""
    node = install.nodes[0]
    step = Step(what, rolls)
    sampling = threading.Event()

    def sample() -> None:  # how many plugin instances kubelet can see at once during the rollout
        while not sampling.is_set():
            step.most_sockets = max(step.most_sockets, len(realinstall.registration_sockets(node)))
            time.sleep(0.2)

    before = {p["metadata"]["uid"] for p in install.driver_pods()}
    sampler = threading.Thread(target=sample, daemon=True)
    with rolloutkit.Churn(install, tag=what.replace(" ", "").replace(">", "").lower()) as churn:
        time.sleep(5)
        sampler.start()
        began = time.monotonic()
        apply()
        if rolls:
            rolloutkit.wait_driver_replaced(install, what, before, began, one_plugin_per_node=True)
        install.wait_rolled_out()
        step.seconds = time.monotonic() - began
        time.sleep(SOAK_S)
        step.figures = churn.stop()
        sampling.set()
        assert churn.errors == [], churn.errors
    if not rolls:
        now = {p["metadata"]["uid"] for p in install.driver_pods()}
        assert now == before, f"{what}: the apply of identical images and objects replaced the driver pod"
    step.disrupted, step.daemons = rolloutkit.disruptions(install, steady)
    with_cleanup = 120.0
    try:
        eventually(lambda: rolloutkit.leaks(install, steady) == [], with_cleanup, f"{what}: churn state cleaned up")
    except AssertionError:
        step.leaks = rolloutkit.leaks(install, steady)
        for line in rolloutkit.explain_daemon_pods(install, step.leaks):
            install.say(f"  {line}")
    step.sockets_after = realinstall.registration_sockets(node)
    install.say(
        f"{what}: {'rollout' if rolls else 'no pod replaced (identical images and objects)'} {step.seconds:.1f}s, "
        f"at most {step.most_sockets} plugin registration sockets at once; {step.figures.line()}; "
        f"disrupted steady pods {len(step.disrupted)}; MPS daemons replaced {len(step.daemons)}; "
        f"leaks {len(step.leaks)}"
    )
    figures = step.figures
    for line in figures.failed_events + figures.fetch_refused + figures.not_running + step.disrupted + step.daemons:
        install.say(f"  {line}")
    for line in step.leaks:
        install.say(f"  leak: {line}")
    return step


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    commit = previous.resolve_commit(REPO, os.environ.get(PREVIOUS_ENV) or previous.PREVIOUS)
    tree, built = previous.previous_images(REPO, commit, out=print)
    for image in built:
        print(f"N-1 image {image.pinned_ref}: {'cache hit' if image.cached else f'built in {image.seconds:.0f}s'}")
    compat = realinstall_compat.needs_compat(REPO, commit)
    with (
        own_control_plane(tmp_path_factory, "rollout") as handle,
        installed_cluster(handle, NODES, first=("N-1", tree, built), compat=compat) as install,
    ):
        install.kubectl("create", "namespace", rolloutkit.NS)
        same = {b.pinned_ref for b in install.built["N-1"]} == {b.pinned_ref for b in install.built["N"]} and (
            realinstall.rendered(install.kubectl, tree) == realinstall.rendered(install.kubectl, REPO)
        )
        install.say(f"N-1 is {commit[:12]}; its images and objects are N's: {same}")
        steady = rolloutkit.steady(install, "steady")
        install.say(f"steady claims on N-1: {[(p.name, p.devices, p.mps_pids) for p in steady]}")

        def restart() -> str:
            workload = f"daemonset/{realinstall.DAEMONSET}"
            return install.kubectl("rollout", "restart", "-n", realinstall.NAMESPACE, workload)

        up, down = (
            (lambda: install.install("N", REPO, install.built["N"])),
            (lambda: install.install("N-1", tree, install.built["N-1"])),
        )
        steps = [_roll(install, "N-1 -> N", up, steady, not same)]
        steady_n = rolloutkit.steady(install, "steadyn", ("mps",))
        install.say(f"steady MPS claim on N: {[(p.name, p.mps_pids) for p in steady_n]}")
        steps += [
            _roll(install, "N -> N", restart, steady + steady_n, True),
            _roll(install, "N -> N-1", down, steady + steady_n, not same),
        ]
        seamless_n1 = (tree / "gpuplane" / "driver" / "plugin" / "socket_names.py").is_file()
        yield Run(commit, same, seamless_n1, steady, steady_n, steps, install)
        for pod in steady + steady_n:
            install.kubectl("delete", "pod,resourceclaim", "-n", rolloutkit.NS, pod.name, "--wait=true", timeout=180)
        install.real.wait_clean(120)
        print("\n".join(install.log))


def test_rollouts_prepare_every_claim_and_disrupt_no_pod(run: Run) -> None:
    for step in run.steps:
        assert step.figures.not_running == [], (step.what, step.figures.not_running)
        assert step.disrupted == [], (step.what, step.disrupted)
        assert step.figures.prepared > 0, step.what
        if step.what != "N -> N-1" or run.seamless_n1:
            # A rollback to an N-1 without the seamless update stops the plugin before its own starts
            # (maxSurge 0): prepares in that gap fail and kubelet retries; the figures above report them.
            assert step.figures.failed_events == [], (step.what, step.figures.failed_events)
    for step in run.steps[:2]:
        if step.rolled:
            assert step.most_sockets == 2, f"{step.what}: the new plugin registered beside the old one"
    assert run.steps[1].rolled, "N -> N replaced the driver pod"
    (uid,) = [p["metadata"]["uid"] for p in run.install.driver_pods()]
    want = f"gpu.gpuplane.dev-{uid}-reg.sock" if run.seamless_n1 else "gpu.gpuplane.dev-reg.sock"
    assert run.steps[-1].sockets_after == [want]


def test_rollouts_leak_nothing(run: Run) -> None:
    assert [(s.what, s.leaks) for s in run.steps if s.leaks] == []


def test_steady_mps_daemon_survives_the_rollouts(run: Run) -> None:
    """N's daemon pod outlives N's driver pod (N -> N) and the rollback to N-1 (N -> N-1)."""
    (mps,) = run.steady_n
    assert mps.mps_pids, "the steady MPS claim made on N had a control daemon before the rollouts"
    running = rolloutkit.daemon_pods(run.install, mps.node, set())
    assert f"gpuplane-mps-{mps.claim_uid}" in running, f"the steady MPS claim's daemon pod ended or is gone: {running}"
    replaced = [(s.what, [d for d in s.daemons if d.startswith(f"{mps.name}:")]) for s in run.steps[1:]]
    assert [r for r in replaced if r[1]] == []
    n1 = [d for d in run.steps[0].daemons if d.startswith("steady-mps:")]
    if n1:
        print(f"N-1 -> N: {N1_DAEMONS_DIE}: {n1}")


def test_previous_version_named(run: Run) -> None:
    print(f"N-1: {run.commit} (images and objects identical to N: {run.same_as_n})")
    assert previous.resolve_commit(REPO, run.commit) == run.commit
