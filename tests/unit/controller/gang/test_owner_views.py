"""A gang's Jobs and LeaderWorkerSets as the controller indexes them: typed views parsed once (issue 34)."""

from __future__ import annotations

import pickle
from typing import Any

from gpuplane.controller import caches, events, names
from gpuplane.controller.gang import leaderworkersets, owners
from tests.templatekit import NS, job


def _job(conditions: list[Any], **spec: Any) -> dict[str, Any]:
    body = job("j", "g")
    body["spec"].update(spec)
    body["status"] = {"conditions": conditions}
    return body


def _lws(template: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": NS}, "spec": {"leaderWorkerTemplate": {"workerTemplate": template}}}


def test_a_job_is_read_once_into_what_the_gang_decisions_use() -> None:
    view = owners.job_view(job("js-w-0", "g", jobset="js"))
    assert (view.name, view.namespace, view.uid, view.gang) == ("js-w-0", NS, "uid-js-w-0", f"{NS}/g")
    assert view.jobset == events.ObjectRef("jobset.x-k8s.io/v1alpha2", "JobSet", "js", NS, "js")
    assert view.ref() == events.ObjectRef("batch/v1", "Job", "js-w-0", NS, "uid-js-w-0")
    assert not (view.suspend or view.ever_suspended or view.complete or view.finished) and view.failed is None


def test_each_condition_means_what_the_job_controller_means_by_it() -> None:
    failed = owners.job_view(job("j", "g", failed=True))
    assert failed.failed == "BackoffLimitExceeded: limit" and failed.finished
    target = owners.job_view(_job([{"type": "FailureTarget", "status": "True"}]))
    assert target.failed == "" and not target.finished  # about to fail: gives the gang up, not yet finished
    assert owners.verdict([target]).message == "Job j failed"
    criteria = owners.job_view(_job([{"type": "SuccessCriteriaMet", "status": "True"}]))
    assert criteria.complete and not criteria.finished
    resumed = owners.job_view(_job([{"type": "Suspended", "status": "False"}]))
    assert resumed.ever_suspended and not resumed.suspend
    stale = owners.job_view(_job([{"type": "Failed", "status": "False"}]))
    assert stale.failed is None and not stale.finished


def test_a_hostile_body_reads_as_nothing_rather_than_raising() -> None:
    for body in (
        {},
        {"metadata": "x", "spec": ["y"], "status": 3},
        {"metadata": {"name": "j", "ownerReferences": ["js", None]}, "status": {"conditions": ["Failed", 7]}},
        {"metadata": {"ownerReferences": 5}, "status": {"conditions": {"type": "Failed"}}},
        {"metadata": {"namespace": NS}, "spec": {"template": {"metadata": {"labels": {names.LABEL_GANG: 5}}}}},
    ):
        view = owners.job_view(body)
        assert view.gang is None and view.failed is None and view.jobset is None
        assert caches.gang_job(body) is caches.NOT_INDEXED  # joins no gang: not indexed
    for lws in (
        {"metadata": 3},
        {"spec": "x"},
        {"spec": {"leaderWorkerTemplate": ["y"]}},
        _lws({"metadata": "z"}),
        _lws({"metadata": {"labels": {"x": 1}}}),
    ):
        assert leaderworkersets.view(lws).gang is None and caches.gang_lws(lws) is caches.NOT_INDEXED
    # A gang's template under metadata that is not an object: read, in no namespace, rather than raising.
    odd_meta = {**_lws({"metadata": {"labels": {names.LABEL_GANG: "g"}}}), "metadata": "m"}
    assert leaderworkersets.view(odd_meta) == leaderworkersets.LwsView(name="", gang="/g")
    odd_job = {**job("j", "g"), "metadata": "m"}
    assert owners.job_view(odd_job).gang == "/g"


def test_the_index_keeps_no_part_of_a_tenants_pod_template() -> None:
    body = job("j", "g")
    body["spec"]["template"]["spec"] = {"containers": [{"name": "c", "env": [{"name": "X", "value": "v" * 1_000_000}]}]}
    (key, entry), *_ = caches.gang_job(body).items()
    assert key == f"{NS}/g" and isinstance(entry, owners.JobView)
    assert len(pickle.dumps(entry)) < 1_000  # the 1 MB template is not held by the index


def test_a_leaderworkerset_is_read_into_its_gang_and_whether_it_goes_away() -> None:
    meta = {"name": "lws", "namespace": NS, "uid": "u", "deletionTimestamp": "2026-12-07T00:00:00Z"}
    template = {"metadata": {"labels": {names.LABEL_GANG: "g"}}}
    body = {"metadata": meta, "spec": {"leaderWorkerTemplate": {"workerTemplate": template}}}
    view = leaderworkersets.view(body)
    assert (view.gang, view.deleting) == (f"{NS}/g", True)
    assert leaderworkersets.event_targets([view]) == (
        events.ObjectRef(leaderworkersets.API_VERSION, leaderworkersets.KIND, "lws", NS, "u"),
    )
    assert caches.gang_lws(body) == {f"{NS}/g": view}
