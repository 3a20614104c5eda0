"""Issue 32, defect 1: a gang's priority is an entitlement (its pods' PriorityClass), never a number its tenant
writes; preemption goes through the Eviction API, is dry-run first, and a PodDisruptionBudget refuses it whole.

The NVL72 clique of the simulated cluster is full with tenant B's running gang; tenant A asks for it.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.controller import kube, steps
from gpuplane.controller.gang import membership, podview, preemption, reconciler, world
from testing.kubeapi import FakeApi
from tests import controllerkit
from tests.controllerkit import GB200, T0, decide, gang_body, holding, make_world, member_pod, pod_index, run_pass

HI = "team-a/hi"


@pytest.fixture(scope="module")
def cluster_slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return controllerkit.cluster_slices(tmp_path_factory.mktemp("sim"))


def _victim(ns: str = "team-b", priority: int = 0) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    return holding("low", ns, priority, ["nvl-0", "nvl-1", "nvl-2", "nvl-3"], T0)


def _hi(spec_priority: int | None = None, **pod: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    extra: dict[str, Any] = {"priority": spec_priority} if spec_priority is not None else {}
    body = gang_body("hi", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200], **extra)
    pods = [member_pod("hi", i, **pod) for i in range(2)]
    return body, pods


def _world(cluster_slices: list[dict[str, Any]], victim_ns: str = "team-b", **hi: Any) -> world.World:
    low = _victim(victim_ns)
    body, pods = _hi(**hi)
    return make_world(cluster_slices, [low[0], body], low[1] + pods, low[2])


def test_self_declared_spec_priority_never_preempts_another_namespace(cluster_slices: list[dict[str, Any]]) -> None:
    # Tenant A writes spec.priority 1,000,000 and has no PriorityClass: before issue 32 it preempted B.
    w = _world(cluster_slices, spec_priority=1_000_000)
    act = run_pass(w)[0].actions[HI]
    assert act.kind == "wait", act
    assert act.victims == () and act.effective_priority == 0
    out = decide(w, HI)
    assert out.victims == () and out.status["phase"] == "Queued"
    assert out.status.get("nominatedVictims") is None
    # The tenant is told that the number does nothing, and what their priority is.
    ignored = [e for e in out.events if e[1] == preemption.REASON_PRIORITY_IGNORED]
    assert ignored and "spec.priority 1000000 is ignored" in ignored[0][2] and ignored[0][2].endswith("here 0")


def test_priority_class_of_the_pods_preempts_a_lower_priority_gang(cluster_slices: list[dict[str, Any]]) -> None:
    w = _world(cluster_slices, priority=1000)
    act = run_pass(w)[0].actions[HI]
    assert (act.kind, act.victims, act.effective_priority) == ("preempt", ("team-b/low",), 1000)
    assert not [e for e in decide(w, HI).events if e[1] == preemption.REASON_PRIORITY_IGNORED]


def test_lowest_member_priority_counts(cluster_slices: list[dict[str, Any]]) -> None:
    low = _victim()
    body, _ = _hi()
    pods = [member_pod("hi", 0, priority=1000), member_pod("hi", 1)]  # one member without the class
    act = run_pass(make_world(cluster_slices, [low[0], body], low[1] + pods, low[2]))[0].actions[HI]
    assert act.kind == "wait" and act.effective_priority == 0


def test_preemption_policy_never_does_not_preempt(cluster_slices: list[dict[str, Any]]) -> None:
    low = _victim()
    body, pods = _hi(priority=1000)
    pods[1]["spec"]["preemptionPolicy"] = "Never"
    act = run_pass(make_world(cluster_slices, [low[0], body], low[1] + pods, low[2]))[0].actions[HI]
    assert act.kind == "wait" and "preemptionPolicy Never" in act.reason


def test_gangs_in_system_namespaces_are_never_victims(cluster_slices: list[dict[str, Any]]) -> None:
    w = _world(cluster_slices, victim_ns="kube-system", priority=1000)
    assert run_pass(w)[0].actions[HI].kind == "wait"
    assert reconciler.victim_outcome("kube-system/low", HI, w, reconciler.Settings()) is None


def test_a_pod_of_another_namespace_is_never_a_member() -> None:
    mine = member_pod("hi", 0, priority=10)
    foreign = member_pod("hi", 1, ns="team-b", priority=1_000_000_000)
    lists = world.member_lists(pod_index([mine, foreign]))
    assert set(lists) == {"team-a/hi", "team-b/hi"}
    members = membership.members_of("hi", 2, lists["team-a/hi"])
    assert list(members.by_index) == [0] and members.priority == 10


def test_unreadable_pod_priority_counts_as_zero() -> None:
    for raw in ("1000", True, 10**12, None, 1.5):
        assert podview.priority_of(raw) == 0
    assert podview.priority_of(-5) == -5


def test_victim_is_evicted_by_uid_and_its_claims_go_only_after_its_pods(cluster_slices: list[dict[str, Any]]) -> None:
    low = _victim()
    body, pods = _hi(priority=1000)
    w = make_world(cluster_slices, [low[0], body], low[1] + pods, low[2])
    vo = reconciler.victim_outcome("team-b/low", HI, w, reconciler.Settings(eviction_grace_s=5))
    assert vo is not None and vo.status["phase"] == "Preempted"
    assert [s.kind for s in vo.steps] == ["evict-pod"] * 4  # no plain delete, no claim deleted under a pod
    first = vo.steps[0]
    assert first.name == "low-pod-0" and first.body == steps.Eviction("pod-low-0", 5, dry_run=False)
    # The victim's own reconcile: pods still running (the eviction not done yet) are evicted again ...
    seen = {**low[0], "status": {**low[0]["status"], **vo.status}}
    again = decide(make_world(cluster_slices, [seen], low[1], low[2]), "team-b/low")
    assert again.status["phase"] == "Preempted" and [s.kind for s in again.steps] == ["evict-pod"] * 4
    # ... while a pod is terminating nothing is deleted ...
    dying = [{**p, "metadata": {**p["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}} for p in low[1]]
    waiting = decide(make_world(cluster_slices, [seen], dying, low[2]), "team-b/low")
    assert waiting.status["phase"] == "Preempted" and waiting.steps == ()
    # ... and once no pod is left its claims are deleted.
    gone = decide(make_world(cluster_slices, [seen], [], low[2]), "team-b/low")
    assert [(s.kind, s.name) for s in gone.steps] == [("delete-claim", f"low-{i}") for i in range(4)]


class _Writer:
    """KubeWriter.run as the API server answers it: dry-run evictions of ``refuse`` pods get 429."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.ran: list[tuple[str, str, bool]] = []

    def run(self, namespace: str, step: steps.Step) -> None:
        assert step.kind == "evict-pod"
        self.ran.append((namespace, step.name, step.body.dry_run))
        if step.name in self.refuse:
            raise kube.StepFailed(f"evict-pod {namespace}/{step.name} refused: violates PodDisruptionBudget b-pdb")


def test_a_refused_eviction_refuses_the_whole_preemption_before_anything_is_written(
    cluster_slices: list[dict[str, Any]],
) -> None:
    w = _world(cluster_slices, priority=1000)
    out = decide(w, HI)
    assert out.victims == ("team-b/low",)
    writer = _Writer(refuse={"low-pod-2"})
    checked = reconciler.checked_preemption(writer, w.gangs[HI], out, w, reconciler.Settings())  # type: ignore[arg-type]
    assert all(dry for _, _, dry in writer.ran)  # only dry runs: the victim is untouched
    assert writer.ran[-1] == ("team-b", "low-pod-2", True)
    assert checked.victims == ()
    assert checked.status["reason"] == preemption.REASON_REFUSED
    assert checked.status["nominatedVictims"] is None
    msg = checked.status["message"]
    assert msg.startswith("preemption of gang team-b/low refused: ") and "PodDisruptionBudget b-pdb" in msg
    assert msg.endswith("; waiting")
    assert ("Warning", preemption.REASON_REFUSED, msg) in checked.events
    assert not [e for e in checked.events if e[1] == preemption.PREEMPTING]
    # The next pass refuses the same way without a second Event.
    seen = w.gangs[HI].with_status(checked.status)
    again = reconciler.checked_preemption(_Writer({"low-pod-2"}), seen, out, w, reconciler.Settings())  # type: ignore[arg-type]
    assert not [e for e in again.events if e[1] == preemption.REASON_REFUSED]
    # Every eviction allowed: the preemption stands as decided.
    ok = reconciler.checked_preemption(_Writer(set()), w.gangs[HI], out, w, reconciler.Settings())  # type: ignore[arg-type]
    assert ok is out


BUDGET = "Cannot evict pod as it would violate the pod's disruption budget."
BUDGET_CAUSE = "The disruption budget b-pdb needs 4 healthy pods"
EVICTION = "/api/v1/namespaces/team-b/pods/low-pod-0/eviction"


def _kube_writer(status: int = 0) -> tuple[kube.KubeWriter, FakeApi]:
    """KubeWriter over the API in memory; ``status``: its answer to an eviction (a budget's 429, say)."""
    api = FakeApi(fail={("POST", "eviction"): status} if status else {}, message=BUDGET, causes=(BUDGET_CAUSE,))
    return kube.KubeWriter(api), api


def test_eviction_step_pins_the_uid_and_passes_dry_run() -> None:
    writer, api = _kube_writer()
    writer.run("team-b", steps.Step("evict-pod", "low-pod-0", steps.Eviction("u-1", 5, dry_run=True)))
    first = api.calls[0]
    assert (first.method, first.path, first.params) == ("POST", EVICTION, {"dryRun": "All"})
    assert first.body["metadata"] == {"name": "low-pod-0", "namespace": "team-b"}
    assert first.body["deleteOptions"] == {"preconditions": {"uid": "u-1"}, "gracePeriodSeconds": 5}
    writer.run("team-b", steps.Step("evict-pod", "low-pod-0", steps.Eviction("u-1")))
    assert api.calls[1].params == {}
    assert api.calls[1].body["deleteOptions"] == {"preconditions": {"uid": "u-1"}}


def test_eviction_step_refused_by_a_budget_says_which() -> None:
    step = steps.Step("evict-pod", "low-pod-0", steps.Eviction("u-1"))
    with pytest.raises(kube.StepFailed, match=r"refused: Cannot evict pod .* \(The disruption budget b-pdb"):
        _kube_writer(429)[0].run("team-b", step)
    for done in (404, 409):  # gone, or another pod of the name: not the one meant
        _kube_writer(done)[0].run("team-b", step)
    writer, api = _kube_writer()
    with pytest.raises(kube.StepFailed, match="no uid"):
        writer.run("team-b", steps.Step("evict-pod", "low-pod-0", steps.Eviction("")))
    assert api.calls == []  # nothing sent
