"""gpuplane.controller.claimtemplate: a ResourceClaimTemplate as the template index keeps it, and right-sizing's
memory of the templates it just made (read back as the index will hold them)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.controller import caches, claimtemplate
from gpuplane.controller.rightsize import apply, template

SPEC = {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplane.dev", "count": 2}}]}}
BODY: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {
        "namespace": "ns",
        "name": "infer",
        "labels": {template.LABEL_REQUEST: "infer", "big": "x" * 1000},
        "annotations": {template.ANNOTATION_HASH: "h1", "kubectl.kubernetes.io/last-applied-configuration": "x" * 5000},
        "ownerReferences": [
            {"kind": "GpuRequest", "name": "infer", "uid": "u-1", "controller": True},
            {"kind": "Thing", "name": "t", "uid": "u-2"},
        ],
    },
    "spec": {"metadata": {"labels": {"a": "b"}}, "spec": SPEC},
}


def test_the_index_keeps_the_claim_spec_as_written_and_only_gpuplanes_annotations() -> None:
    (got,) = caches.claim_template(BODY).values()
    assert isinstance(got, claimtemplate.TemplateView) and got.key == "ns/infer"
    assert got.claim_spec == SPEC and got.claim_spec is SPEC  # shared, not copied
    assert dict(got.annotations) == {template.ANNOTATION_HASH: "h1"}
    assert got.controllers == frozenset({("GpuRequest", "u-1")})  # controller references only
    assert caches.rightsized_template(BODY) == caches.claim_template(BODY)
    unlabelled = {**BODY, "metadata": {**BODY["metadata"], "labels": {}}}
    assert caches.rightsized_template(unlabelled) == caches.NOT_INDEXED


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"metadata": "x", "spec": []},
        {"metadata": {"name": 7, "annotations": {"gpuplane.dev/a": 1}, "ownerReferences": "no"}, "spec": {"spec": 3}},
        {"metadata": {"ownerReferences": [{"controller": True, "uid": 5}, "x"]}, "spec": {"spec": None}},
    ],
)
def test_a_template_of_any_shape_reads_as_absent_fields_not_an_error(body: dict[str, Any]) -> None:
    got = claimtemplate.view(body)
    assert (got.name, dict(got.claim_spec), dict(got.annotations), got.controllers) == ("", {}, {}, frozenset())


def test_right_sizing_reads_its_own_new_template_until_the_index_shows_that_plan() -> None:
    made = apply.Templates()
    made.remember("ns/infer", BODY, now=100.0)
    older = claimtemplate.view(
        {**BODY, "metadata": {**BODY["metadata"], "annotations": {template.ANNOTATION_HASH: "h0"}}}
    )
    got = made.recent("ns/infer", older, now=101.0)
    assert got is not None and got.annotations[template.ANNOTATION_HASH] == "h1"  # the index still lags
    assert made.recent("ns/infer", None, now=101.0) == got  # not listed yet
    seen = claimtemplate.view(BODY)
    assert made.recent("ns/infer", seen, now=102.0) is seen and "ns/infer" not in made.written  # caught up
    made.remember("ns/infer", BODY, now=100.0)
    assert made.recent("ns/infer", older, now=100.0 + apply.TEMPLATE_TTL_S + 1) is older  # remembered too long
