"""Did every example reach the state it exists to show? The demo's exit status, decided over what it read.

Each example folder under ``manifests/examples`` shows one thing and ends in one state: every pod
Running, except the folders in ``STAYS_PENDING`` (``unsatisfiable``), whose pods must stay Pending
with the scheduler's reason (a pod of theirs that runs is as wrong as a pod of another that waits).
``judge`` compares the pods of each example (read once, at the end of the demo) with that
expectation and returns one ``Finding`` per pod that missed it, with the scheduler's condition,
the newest Event about the pod and what to do next; ``render`` turns them into the lines the demo
prints before it exits non-zero. An example whose pods never appeared is a finding too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Examples that show a claim no node can satisfy: their pods stay Pending on purpose.
STAYS_PENDING = frozenset({"unsatisfiable"})


@dataclass(frozen=True)
class Finding:
    """One example pod (or an example without pods) that did not reach its expected state."""

    example: str
    pod: str  # namespace/name, or "" when the example has no pod at all
    expected: str
    actual: str
    scheduler: str = ""
    event: str = ""
    folder: str = ""  # where the example's YAML (and README) is; manifests/examples/<example> when empty

    @property
    def next_step(self) -> str:
        where = f"the example: {self.folder or f'manifests/examples/{self.example}'}/"
        if not self.pod:
            return f"kubectl get all -n <the example's namespace>; {where}"
        namespace, name = self.pod.split("/", 1)
        return f"kubectl gpuplane why pod/{name} -n {namespace}; kubectl describe pod {name} -n {namespace}; {where}"


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == kind:
            return condition
    return {}


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Pending because kube-scheduler said it cannot place the pod."""
    scheduled = _condition(pod, "PodScheduled")
    return scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"


def state_of(pod: Mapping[str, Any]) -> str:
    """A pod's state in the words of the verdict: its phase, with the reason a Pending pod waits."""
    phase = str((pod.get("status") or {}).get("phase") or "Unknown")
    if phase != "Pending":
        return phase
    if unschedulable(pod):
        return "Pending (unschedulable)"
    if _condition(pod, "PodScheduled").get("status") == "True":
        return "Pending (scheduled, containers not started)"
    return "Pending (not yet scheduled)"


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def newest_events(events: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """namespace/name of each Pod -> "Reason: message" of the newest Event about it."""
    newest: dict[str, tuple[str, str]] = {}
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "Pod":
            continue
        key = f"{involved.get('namespace', '')}/{involved.get('name', '')}"
        when = str(event.get("lastTimestamp") or event.get("eventTime") or "")
        text = f"{event.get('type', '')} {event.get('reason', '')}: {event.get('message', '')}".strip()
        if key not in newest or when >= newest[key][0]:
            newest[key] = (when, text)
    return {key: text for key, (_, text) in newest.items()}


def judge(
    pods_by_example: Mapping[str, Sequence[Mapping[str, Any]]],
    events: Sequence[Mapping[str, Any]] = (),
    stays_pending: frozenset[str] = STAYS_PENDING,
    folders: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Every pod of every example against its example's expected state; sorted by example and pod."""
    about = newest_events(events)
    where = folders or {}
    findings: list[Finding] = []
    for example in sorted(pods_by_example):
        pods = pods_by_example[example]
        pending = example in stays_pending
        expected = "Pending (unschedulable)" if pending else "Running"
        if not pods:
            findings.append(Finding(example, "", expected, "no pod was created", folder=where.get(example, "")))
            continue
        for pod in sorted(pods, key=_key):
            ok = unschedulable(pod) if pending else (pod.get("status") or {}).get("phase") == "Running"
            if ok:
                continue
            scheduled = _condition(pod, "PodScheduled")
            findings.append(
                Finding(
                    example,
                    _key(pod),
                    expected,
                    state_of(pod),
                    scheduler=str(scheduled.get("message") or ""),
                    event=about.get(_key(pod), ""),
                    folder=where.get(example, ""),
                )
            )
    return findings


def render(findings: Sequence[Finding], examples: int) -> list[str]:
    """The lines the demo prints: a verdict first, then each finding with what to do next."""
    if not findings:
        return [f"verdict: all {examples} examples reached their expected state"]
    failed = sorted({f.example for f in findings})
    lines = [f"verdict: FAILED: {len(failed)} of {examples} examples missed their expected state: {', '.join(failed)}"]
    for f in findings:
        what = f"pod {f.pod} is {f.actual}" if f.pod else f.actual
        lines.append(f"  {f.example}: {what}, expected {f.expected}")
        if f.scheduler:
            lines.append(f"    scheduler: {f.scheduler}")
        if f.event:
            lines.append(f"    newest Event: {f.event}")
        lines.append(f"    next: {f.next_step}")
    return lines
