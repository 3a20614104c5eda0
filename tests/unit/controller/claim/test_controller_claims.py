"""Controller claim checks without a cluster: config validation, the domain warning, why a claim waits, the review.

Slices come from the real driver code on the simulator (:mod:`tests.controllerkit`); the review
is checked as the pure decision and as the writes it makes, in order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuplane.controller import events, names
from gpuplane.controller.claim import checks, failfast, review
from gpuplane.controller.node import snapshot_builder
from tests.controllerkit import CLASSES, claim_body, cluster_slices, explain, req

NOW = "2026-12-01T00:00:00Z"


@pytest.fixture(scope="module", name="slices")
def _slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return cluster_slices(tmp_path_factory.mktemp("sim"))


BAD_CONFIG = [
    {
        "requests": ["g"],
        "opaque": {
            "driver": "gpu.gpuplane.dev",
            "parameters": {
                "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 150}},
            },
        },
    }
]


def test_claim_config_validation_messages() -> None:
    bad = claim_body([req("g")], BAD_CONFIG)
    problems = checks.validate(bad, CLASSES)
    assert len(problems) == 1 and "defaultActiveThreadPercentage" in problems[0] and "150" in problems[0]
    mig_ts = claim_body(
        [req("m", cls="mig.gpuplane.dev")],
        [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {
                        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                        "kind": "MigDeviceConfig",
                        "sharing": {"strategy": "TimeSlicing"},
                    },
                }
            }
        ],
    )
    assert "not supported on MIG" in checks.validate(mig_ts, CLASSES)[0]
    good = claim_body(
        [req("g")],
        [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "GpuConfig"},
                }
            }
        ],
    )
    assert checks.validate(good, CLASSES) == []


def test_multi_gpu_claim_without_domain_constraint_warns() -> None:
    bare = claim_body([req("g", count=4)])
    warning = checks.domain_warning(bare, CLASSES)
    assert warning and "matchAttribute: gpu.gpuplane.dev/nvlinkDomain" in warning
    ok = claim_body(
        [req("g", count=4)], constraints=[{"requests": ["g"], "matchAttribute": "gpu.gpuplane.dev/nvlinkDomain"}]
    )
    assert checks.domain_warning(ok, CLASSES) is None
    assert checks.domain_warning(claim_body([req("g", count=1)]), CLASSES) is None


def test_unallocated_mig_claim_is_explained(slices: list[dict[str, Any]]) -> None:
    view = snapshot_builder.build_view(slices)
    # Take a 4g on every H100 and GB200 GPU, leaving 3 compute slices: no 4g fits, 2g/3g do.
    taken = {g.id: (snapshot_builder.model.MigInstance("4g", 0),) for g in view.gpus}
    view = dataclasses.replace(view, taken_mig=taken)
    h100_4g = "4g.40gb"
    assert view.profiles[h100_4g] == "4g"
    c = claim_body(
        [req("m", cls="mig.gpuplane.dev", sel=[f'device.attributes["gpu.gpuplane.dev"].migProfile == "{h100_4g}"'])]
    )
    why = explain(c, CLASSES, view)
    assert f"no free placement for profile {h100_4g}" in why
    assert "largest free block per GPU is 3g" in why


def test_partial_share_without_sharing_strategy_is_flagged_before_scheduling() -> None:
    """A sharePercent < 100 on a plain exclusive claim is refused by the driver; the controller says so first."""
    shared = req("g")
    shared["exactly"]["capacity"] = {"requests": {"sharePercent": "50"}}
    problems = checks.validate(claim_body([shared]), CLASSES)
    assert len(problems) == 1 and "sharePercent 50" in problems[0] and "Exclusive" in problems[0]
    whole = req("g")
    whole["exactly"]["capacity"] = {"requests": {"sharePercent": "100"}}
    assert checks.validate(claim_body([whole]), CLASSES) == []
    timesliced = claim_body(
        [shared],
        [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {
                        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing"},
                    },
                }
            }
        ],
    )
    assert checks.validate(timesliced, CLASSES) == []


class RecordingWriter:
    """The three writes a review makes, in the order they are made."""

    def __init__(self, failing_pods: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.failing_pods = failing_pods

    def event(self, ref: events.ObjectRef, kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", ref.name, kind, reason))

    def set_pod_condition(self, namespace: str, name: str, cond: dict[str, Any]) -> None:
        if name in self.failing_pods:
            raise RuntimeError(f"pod {name} not found")
        self.calls.append(("condition", namespace, name, cond["type"], cond["status"]))

    def annotate_claim(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self.calls.append(("annotate", namespace, name, dict(annotations)))


def test_review_of_a_bad_multi_gpu_claim_records_each_finding_once() -> None:
    claim = claim_body([req("g", count=2)], BAD_CONFIG)
    found = review.decide(claim, CLASSES, ["p0", "p1"], NOW)
    assert found is not None
    assert found.findings == ("invalid-config", "no-domain-constraint")
    writer = RecordingWriter(failing_pods=frozenset({"p0"}))
    review.apply(writer, found)  # type: ignore[arg-type]
    assert [c[0] for c in writer.calls] == ["event", "condition", "event", "annotate"]
    assert writer.calls[0][3] == events.CLAIM_INVALID_CONFIG
    assert writer.calls[1] == ("condition", "ns", "p1", names.POD_CONDITION_CLAIM_CONFIG, "False")
    assert writer.calls[2][3] == events.CLAIM_NO_DOMAIN_CONSTRAINT
    annotations = writer.calls[3][3]
    assert "defaultActiveThreadPercentage" in annotations[names.ANNOTATION_CONFIG_ERROR]
    assert annotations[names.ANNOTATION_DOMAIN_WARNING] == "warned"
    # Reviewed again with the annotations recorded: nothing to write.
    claim["metadata"]["annotations"] = annotations
    again = review.decide(claim, CLASSES, ["p0", "p1"], NOW)
    assert again is not None and again.findings == () and again.annotations is None


def test_review_of_a_fixed_claim_clears_the_error_and_the_pod_condition() -> None:
    claim = claim_body([req("g")])
    claim["metadata"]["annotations"] = {names.ANNOTATION_CONFIG_ERROR: "old error"}
    found = review.decide(claim, CLASSES, ["p0"], NOW)
    assert found is not None and found.findings == () and found.config_event is None
    assert found.annotations == {names.ANNOTATION_CONFIG_ERROR: None}
    ((pod, cond),) = found.pod_conditions
    assert pod == "p0" and cond["status"] == "True" and cond["reason"] == "Valid"


def test_claims_of_other_drivers_are_not_reviewed() -> None:
    other = claim_body([req("g", cls="other.example.com")])
    assert review.decide(other, CLASSES, ["p0"], NOW) is None
    with_our_config = claim_body([req("g", cls="other.example.com")], BAD_CONFIG)
    found = review.decide(with_our_config, CLASSES, [], NOW)
    assert found is not None and found.findings == ("invalid-config",)


def test_a_claim_kept_for_its_review_reviews_the_same_and_shares_its_spec() -> None:
    bad = claim_body([req("g", count=2)], BAD_CONFIG)
    bad["metadata"]["annotations"] = {names.ANNOTATION_DOMAIN_WARNING: "warned"}
    bad["metadata"]["labels"] = {"team": "x" * 500}
    bad["status"] = {"reservedFor": [{"resource": "pods", "name": "p9", "uid": "u9"}], "allocation": {"devices": {}}}
    for claim in (bad, claim_body([req("g")]), claim_body([req("g", cls="other.example.com")], BAD_CONFIG)):
        kept = review.essentials(claim)
        assert review.decide(kept, CLASSES, ["p0"], NOW) == review.decide(claim, CLASSES, ["p0"], NOW)
    kept = review.essentials(bad)
    assert "labels" not in kept["metadata"] and "allocation" not in kept["status"]
    assert failfast.consumers_of(kept, ["p0"]) == failfast.consumers_of(bad, ["p0"]) == ["p0", "p9"]
    twin = claim_body([req("g", count=2)], BAD_CONFIG)
    twin["metadata"]["name"] = "twin"
    assert review.essentials(twin)["spec"] is kept["spec"]  # equal specs (one template's claims): one copy
    assert review.essentials(claim_body([req("g")]))["spec"] is not kept["spec"]
