"""Carry out one GpuRequest decision: template writes, status, Event, a log line. Does I/O.

The decision is :func:`gpuplane.controller.rightsize.decide.decide`; here it is written in
order (delete the stale template, create the new one, patch the status, record the Event),
each write fenced by the leader Lease. When the API refuses the template it is given (a
validation error, 422), the GpuRequest says so in its status instead of retrying blindly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

import structlog

from gpuplane.controller import claimtemplate, config, events, kube
from gpuplane.controller.claimtemplate import TemplateView
from gpuplane.controller.deviceclass import ClassView
from gpuplane.controller.rightsize import decide, template
from gpuplane.controller.rightsize.need import RequestView
from gpuplane.informer.client import ApiError

log = structlog.get_logger(__name__)

TEMPLATE_TTL_S = 30.0  # a template this replica created counts until its index shows it, at most this long


@dataclass
class Templates:
    """ResourceClaimTemplates this replica just created, until the index shows them (``rt.state(Templates)``).

    Without this a replaced template read back stale (old plan) would be replaced again.
    """

    written: dict[str, tuple[TemplateView, float]] = field(default_factory=dict)

    @classmethod
    def create(cls, cfg: config.ControllerConfig) -> Self:
        """None written yet."""
        return cls()

    def new_term(self) -> None:
        """An earlier term's writes are read back from the API."""
        self.written.clear()

    def remember(self, key: str, body: Mapping[str, Any], now: float) -> None:
        """A template this replica just created (as the index will hold it)."""
        self.written[key] = (claimtemplate.view(body), now)

    def recent(self, key: str, indexed: TemplateView | None, now: float) -> TemplateView | None:
        """The template as the index shows it, or the one just created when the index still lags behind."""
        entry = self.written.get(key)
        if entry is None:
            return indexed
        made, when = entry
        ann = template.ANNOTATION_HASH
        if now - when > TEMPLATE_TTL_S or (
            indexed is not None and indexed.annotations.get(ann) == made.annotations.get(ann)
        ):
            del self.written[key]
            return indexed
        return made


class Writer(Protocol):
    """The writes a right-sizing reconcile makes (gpuplane.controller.kube.KubeWriter)."""

    def create_claim_template(self, namespace: str, body: Mapping[str, Any]) -> None: ...
    def delete_claim_template(self, namespace: str, name: str) -> None: ...
    def patch_gpu_request_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...
    def event(self, ref: events.ObjectRef, kind: events.EventType, reason: str, message: str) -> None: ...


async def reconcile(
    writer: Writer,
    request: RequestView,
    existing: TemplateView | None,
    slices: Iterable[Any],  # API slices or the controller's digests
    classes: Mapping[str, ClassView],
    *,
    created: Callable[[Mapping[str, Any]], None] = lambda _: None,
) -> decide.Outcome:
    """Decide and write for one GpuRequest; returns the outcome (for tests and metrics)."""
    ns, name = request.namespace, request.name
    out = decide.decide(request, existing, list(slices), classes)
    ref = events.ObjectRef(template.API_VERSION, template.KIND, name, ns, request.uid)
    try:
        if out.delete:
            await asyncio.to_thread(writer.delete_claim_template, ns, out.delete)
        if out.create is not None:
            await asyncio.to_thread(writer.create_claim_template, ns, out.create)
            created(out.create)
    except kube.NotLeader:
        return out
    except ApiError as exc:
        message = f"the API refused the generated ResourceClaimTemplate: {exc.status} {exc.message or exc.reason}"
        log.error("gpu request template refused", gpu_request=f"{ns}/{name}", status=exc.status, error=message)
        failed = template.invalid_status(message, request.generation)
        if out.create is not None:  # not tried again until the plan changes (decide reads this back)
            failed["refusedPlan"] = out.create["metadata"]["annotations"][template.ANNOTATION_HASH]
        if request.status.get("message") != message:
            await asyncio.to_thread(writer.patch_gpu_request_status, ns, name, failed)
            await asyncio.to_thread(writer.event, ref, "Warning", decide.REASON_INVALID, message)
        return decide.Outcome(failed)
    try:
        if out.status is not None:
            await asyncio.to_thread(writer.patch_gpu_request_status, ns, name, out.status)
        if out.event is not None:
            await asyncio.to_thread(writer.event, ref, *out.event)
    except kube.NotLeader:
        return out
    if out.status is not None or out.create is not None:
        status = out.status or {}
        log.info(
            "gpu request reconciled",
            gpu_request=f"{ns}/{name}",
            phase=status.get("phase"),
            template_replaced=bool(out.delete and out.create),
            alternatives=status.get("alternatives"),
            message=status.get("message"),
        )
    return out
