"""The gang index's view of a GpuGang: parsed once, total on any body, read-only, overlaid without change."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.api import kubetime
from gpuplane.controller import caches, names
from gpuplane.controller.gang import reconciler
from gpuplane.controller.gang import view as gang_view
from gpuplane.controller.gang.spec import parse_gang_spec
from tests.controllerkit import make_world

BODY: dict[str, Any] = {
    "apiVersion": names.GANG_API_VERSION,
    "kind": names.GANG_KIND,
    "metadata": {
        "name": "g",
        "namespace": "team-a",
        "uid": "uid-g",
        "generation": 3,
        "creationTimestamp": "2026-12-07T00:00:00Z",
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {"members": 2, "gpusPerMember": 4, "tensorParallelSize": 8},
    "status": {"phase": "Placed", "placement": {"id": "p1"}},
}


def test_a_gang_is_read_once_into_its_view() -> None:
    got = gang_view.view(BODY)
    assert (got.key, got.uid, got.generation, got.deleting, got.phase) == ("team-a/g", "uid-g", 3, False, "Placed")
    assert got.created == kubetime.epoch("2026-12-07T00:00:00Z") > 0
    assert got.spec == parse_gang_spec(BODY["spec"]) and got.invalid == ""
    assert got.status == BODY["status"]
    assert (got.ref.kind, got.ref.api_version, got.ref.name, got.ref.uid) == (
        names.GANG_KIND,
        names.GANG_API_VERSION,
        "g",
        "uid-g",
    )
    assert caches.gang(BODY) == {"team-a/g": got}  # what the gang index keeps
    with pytest.raises(TypeError):  # read-only: every reader shares the one view
        got.status["phase"] = "Running"  # type: ignore[index]


def test_a_spec_that_does_not_parse_keeps_why_and_the_reconcile_says_it() -> None:
    bad = {**BODY, "spec": {"members": "two", "gpusPerMember": 4}}
    got = gang_view.view(bad)
    assert got.spec is None and "members" in got.invalid
    out = reconciler.decide(
        "team-a/g",
        got,
        make_world([], [bad]),
        planned=lambda: pytest.fail("an invalid gang needs no queue pass"),
        domains=lambda: pytest.fail("an invalid gang needs no domains"),
        now=0.0,
        settings=reconciler.Settings(),
    )
    assert out.status == {"phase": "Invalid", "reason": "InvalidSpec", "message": got.invalid}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"metadata": ["g"], "spec": "all", "status": 7},
        {"metadata": {"name": "g", "generation": True, "creationTimestamp": "yesterday"}, "status": None},
        {"metadata": {"name": "g", "generation": "3", "creationTimestamp": 5}, "spec": None},
    ],
)
def test_a_gang_of_any_shape_reads_as_absent_fields_not_an_error(body: dict[str, Any]) -> None:
    got = gang_view.view(body)
    assert got.spec is None and got.invalid  # refused, with a reason, never raised
    assert (got.generation, got.created, got.status, got.phase) == (None, 0.0, {}, "")


def test_the_write_overlay_is_a_new_view_and_leaves_the_indexed_one_alone() -> None:
    indexed = gang_view.view(BODY)
    overlaid = indexed.with_status({"phase": "Running", "placement": None, "readySince": "t"})
    assert overlaid.phase == "Running" and overlaid.status["placement"] == {"id": "p1"}  # None: left as it is
    assert overlaid.status["readySince"] == "t" and overlaid.spec is indexed.spec
    assert indexed.phase == "Placed" and "readySince" not in indexed.status
