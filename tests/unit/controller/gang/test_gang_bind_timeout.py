"""A placed gang whose members the scheduler never binds is released and requeued, with a reason (issue 18, defect 2).

Before, such a gang (its MIG profile absent on the GPUs it was placed on, or a selector the
controller could not pre-filter) sat at ``Placed / GatesLifted`` forever, its pods Pending.
Now, past ``--bind-timeout`` (default 600 s) after ``placedAt`` with members still unbound,
the gang releases its member pods and claims (their owner recreates the pods, gated, and the
gang queues again) and says why in a Warning Event ``BindTimeout``.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.api import kubetime
from gpuplane.controller import names
from gpuplane.controller.gang import placement_record, reconciler, world
from tests import controllerkit as kit


@pytest.fixture(scope="module", name="slices")
def slices_fixture(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return kit.cluster_slices(tmp_path_factory.mktemp("sim"))


def _placed(slices: list[dict[str, Any]], placed_at: float) -> tuple[Any, str]:
    """A 2-member whole-GPU gang, placed (gates lifted, claims written) at ``placed_at``, nothing bound."""
    body = kit.gang_body("g", members=2, gpusPerMember=1)
    first = kit.decide(kit.gang_world(slices, body, 2), "team-a/g")
    placement = first.status["placement"]
    decided = placement_record.decision_from_status("team-a/g", placement, {})
    assert decided is not None
    st = {"phase": "Placed", "reason": "GatesLifted", "placement": placement, "placedAt": kubetime.rfc3339(placed_at)}
    body = kit.gang_body("g", members=2, gpusPerMember=1, status_=st)
    pods = [kit.member_pod("g", i, gated=False) for i in range(2)]
    claims = [
        {
            "metadata": {
                "name": f"g-{i}",
                "namespace": "team-a",
                "labels": {names.LABEL_MEMBER_INDEX: str(i)},
                "annotations": {names.ANNOTATION_DECISION: placement_record.decision_id(decided)},
                "ownerReferences": [{"apiVersion": names.GANG_API_VERSION, "kind": names.GANG_KIND, "name": "g"}],
            },
            "spec": {},
            "status": {},
        }
        for i in range(2)
    ]
    return kit.make_world(slices, [body], pods, claims), "team-a/g"


def _decide(w: Any, key: str, now: float) -> reconciler.Outcome:
    plan, view = kit.run_pass(w, now)
    settings = reconciler.Settings(eviction_grace_s=0, bind_timeout_s=600.0)
    return reconciler.decide(
        key,
        w.gangs[key],
        w,
        planned=lambda: (plan, view),
        domains=lambda: world.gpu_domains(w),
        now=now,
        settings=settings,
    )


def test_a_placed_gang_not_bound_within_the_timeout_is_released_with_a_reason(slices: list[dict[str, Any]]) -> None:
    w, key = _placed(slices, kit.T0)
    out = _decide(w, key, kit.T0 + 601)
    assert out.status["phase"] == "Preempted" and out.status["reason"] == "BindTimeout", out.status
    assert "0 of 2 members bound" in out.status["message"]
    assert [e[1] for e in out.events if e[0] == "Warning"] == ["BindTimeout"]
    kinds = sorted(s.kind for s in out.steps)
    assert kinds == ["delete-claim", "delete-claim", "delete-pod", "delete-pod"], kinds
    assert out.status.get("placement") is None


def test_within_the_timeout_the_placement_stands(slices: list[dict[str, Any]]) -> None:
    w, key = _placed(slices, kit.T0)
    out = _decide(w, key, kit.T0 + 599)
    assert out.status["phase"] == "Placed" and not out.steps
