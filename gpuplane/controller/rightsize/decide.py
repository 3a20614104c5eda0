"""One GpuRequest's reconcile decision: the status it should show and the template writes. Pure.

Inputs are what the controller's indexes hold (the GpuRequest, the template of that name if
any, gpuplane's ResourceSlices, the DeviceClasses); the output says what to write, in order:
delete a stale template, create the current one, patch the status, record an Event. Nothing is
written when nothing changed, so a reconcile repeated every few seconds costs no API write.

Failure modes, each a status the user reads with ``kubectl get gpurequest`` and one Event:

* ``Invalid``: the need is malformed or can never be met here (memory larger than every GPU,
  an unknown tier, a template of that name that this GpuRequest does not own). A template it
  made earlier is deleted: new pods must not get a plan for a need that no longer stands.
* ``Pending``: no gpuplane GPU is published yet; checked again on the next pass. An existing
  template is kept (the fleet may only be restarting).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.controller import events
from gpuplane.controller.claimtemplate import TemplateView
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.rightsize import alternatives, fleet, template
from gpuplane.controller.rightsize.need import NeedError, RequestView, parse_need

REASON_READY = "ClaimTemplateReady"
REASON_INVALID = "InvalidGpuRequest"
REASON_PENDING = "WaitingForGpus"


@dataclass(frozen=True)
class Outcome:
    """What to write for one GpuRequest (None/empty: nothing)."""

    status: dict[str, Any] | None  # the new status, or None when it is unchanged
    delete: str | None = None  # template to delete first
    create: dict[str, Any] | None = None  # template to create
    event: tuple[events.EventType, str, str] | None = None


def _changed(current: Mapping[str, Any] | None, want: Mapping[str, Any]) -> bool:
    return {k: v for k, v in (current or {}).items() if k in want} != dict(want)


def decide(
    request: RequestView,
    existing: TemplateView | None,
    slices: Iterable[Any],  # API slices or the controller's digests
    classes: Mapping[str, ClassView],
) -> Outcome:
    """The writes that bring ``request``'s template and status in line with its need and the fleet."""
    name, generation, current = request.name, request.generation, request.status
    ours = existing is not None and template.owned_by(existing, request)
    try:
        need = parse_need(request.spec)
        plan = alternatives.plan(need, fleet.models(slices), fleet.tiers(classes))
    except NeedError as exc:
        pending = "no gpuplane GPU is published" in str(exc)
        status = template.invalid_status(str(exc), generation, "Pending" if pending else "Invalid")
        if pending and ours:
            status["claimTemplate"] = name
        if not _changed(current, status):
            return Outcome(None, delete=name if ours and not pending else None)
        reason = REASON_PENDING if pending else REASON_INVALID
        return Outcome(status, delete=name if ours and not pending else None, event=("Warning", reason, str(exc)))
    if existing is not None and not ours:
        msg = (
            f"a ResourceClaimTemplate named {name} already exists and this GpuRequest does not own it; "
            "rename the GpuRequest or delete that template"
        )
        status = template.invalid_status(msg, generation)
        if not _changed(current, status):
            return Outcome(None)
        return Outcome(status, event=("Warning", REASON_INVALID, msg))
    want = template.desired(request, plan)
    want_hash = want["metadata"]["annotations"][template.ANNOTATION_HASH]
    have_hash = existing.annotations.get(template.ANNOTATION_HASH) if existing is not None else None
    if current.get("refusedPlan") == want_hash and existing is None:
        return Outcome(None)  # the API refused this very template; a changed need or fleet tries again
    status = template.ready_status(need, plan, generation, name)
    write = existing is None or have_hash != want_hash
    if not write and not _changed(current, status):
        return Outcome(None)
    event: tuple[events.EventType, str, str] | None = None
    if _changed(current, status):
        event = (
            "Normal",
            REASON_READY,
            f"{need.describe()} -> "
            + "; ".join(status["alternatives"])
            + (f" ({'; '.join(plan.notes)})" if plan.notes else ""),
        )
    return Outcome(
        status if _changed(current, status) else None,
        delete=name if existing is not None and write else None,
        create=want if write else None,
        event=event,
    )
