"""The DRAPlugin gRPC service (v1 and v1beta1): translation between kubelet's messages and ClaimPreparer.

One class serves both API versions; they differ only in the generated message
module and in whether ``Device.share_id`` exists (v1 only). The servicer
times the call, hands plain :class:`~gpuplane.driver.prepare.contract.ClaimRef` values to
the preparer, and answers exactly one entry per requested claim uid: a claim
the preparer omitted, or a whole batch whose preparer raised, gets an error
string, so kubelet retries those claims and the call itself never fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol, TypeVar

import grpc
import structlog

from gpuplane.driver._proto.dra.v1 import api_pb2 as v1_pb2
from gpuplane.driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from gpuplane.driver.plugin import wire
from gpuplane.driver.prepare import contract

_log = structlog.get_logger(__name__)

V1_SERVICE = "v1.DRAPlugin"
"""The name registration advertises for the v1 service (kubelet's ``drapbv1.DRAPluginService``)."""
V1BETA1_SERVICE = "v1beta1.DRAPlugin"
"""The name registration advertises for the v1beta1 service."""

V1_GRPC_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
V1BETA1_GRPC_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"

TimingHook = Callable[[str, float, int], None]
"""Called after every call as ``hook(op, seconds, n_errors)``; op is "prepare" or "unprepare"."""

OMITTED_ERROR = "driver returned no result for this claim"

_R = TypeVar("_R", contract.PrepareResult, contract.UnprepareResult)


class _ClaimMessage(Protocol):
    @property
    def namespace(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def name(self) -> str: ...


class _ClaimsRequest(Protocol):
    @property
    def claims(self) -> Iterable[_ClaimMessage]: ...


def claim_refs(request: _ClaimsRequest) -> list[contract.ClaimRef]:
    """The request's claims as plain references, first occurrence of each uid kept."""
    seen: set[str] = set()
    refs: list[contract.ClaimRef] = []
    for claim in request.claims:
        if claim.uid in seen:
            continue
        seen.add(claim.uid)
        refs.append(contract.ClaimRef(namespace=claim.namespace, uid=claim.uid, name=claim.name))
    return refs


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def complete_results(
    claims: Sequence[contract.ClaimRef],
    call: Callable[[Sequence[contract.ClaimRef]], Mapping[str, _R]],
    failed: Callable[[str], _R],
    op: str,
) -> dict[str, _R]:
    """Run ``call`` and return exactly one result per claim uid, errors standing in for gaps."""
    if not claims:
        return {}
    try:
        returned = call(claims)
    except Exception as exc:
        _log.exception("claim batch failed", op=op)
        message = f"{op} failed: {_describe(exc)}"
        return {claim.uid: failed(message) for claim in claims}
    wanted = {claim.uid for claim in claims}
    extra = sorted(set(returned) - wanted)
    if extra:
        _log.warning("driver answered claims that were not requested", op=op, extra_uids=extra)
    results: dict[str, _R] = {}
    for claim in claims:
        result = returned.get(claim.uid)
        if result is None:
            _log.error("driver omitted a claim", op=op, claim_uid=claim.uid)
            result = failed(OMITTED_ERROR)
        results[claim.uid] = result
    return results


class DRAServicer:
    """Serves ``DRAPlugin`` for one API version; see :func:`add_dra_services`."""

    def __init__(
        self,
        preparer: contract.ClaimPreparer,
        *,
        messages: ModuleType,
        api_version: str,
        carries_share_id: bool,
        timing: TimingHook | None = None,
    ) -> None:
        self._preparer = preparer
        self._messages = messages
        self._api_version = api_version
        self._carries_share_id = carries_share_id
        self._timing = timing

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Prepare the requested claims; one response entry per claim uid."""
        started = time.perf_counter()
        claims = claim_refs(request)
        with structlog.contextvars.bound_contextvars(
            op="prepare", api=self._api_version, claim_uids=[c.uid for c in claims]
        ):
            results = complete_results(
                claims, self._preparer.prepare, lambda msg: contract.PrepareResult(error=msg), "prepare"
            )
            response = self._messages.NodePrepareResourcesResponse()
            for uid, result in list(results.items()):
                try:
                    entry = self._prepare_entry(result)
                except Exception as exc:  # a malformed result fails its claim, not the call
                    _log.exception("cannot encode prepare result", claim_uid=uid)
                    results[uid] = contract.PrepareResult(error=f"invalid prepare result: {_describe(exc)}")
                    entry = self._prepare_entry(results[uid])
                response.claims[uid].CopyFrom(entry)
            n_errors = sum(1 for result in results.values() if result.error)
            self._finish("prepare", started, len(results), n_errors)
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Unprepare the requested claims; one response entry per claim uid."""
        started = time.perf_counter()
        claims = claim_refs(request)
        with structlog.contextvars.bound_contextvars(
            op="unprepare", api=self._api_version, claim_uids=[c.uid for c in claims]
        ):
            results = complete_results(
                claims, self._preparer.unprepare, lambda msg: contract.UnprepareResult(error=msg), "unprepare"
            )
            response = self._messages.NodeUnprepareResourcesResponse()
            for uid, result in results.items():
                response.claims[uid].CopyFrom(self._messages.NodeUnprepareResourceResponse(error=result.error))
            n_errors = sum(1 for result in results.values() if result.error)
            self._finish("unprepare", started, len(results), n_errors)
        return response

    def _prepare_entry(self, result: contract.PrepareResult) -> Any:
        entry = self._messages.NodePrepareResourceResponse()
        if result.error:
            entry.error = result.error  # kubelet ignores devices on error; send none
            return entry
        for device in result.devices:
            wire = entry.devices.add(
                request_names=device.request_names,
                pool_name=device.pool_name,
                device_name=device.device_name,
                cdi_device_ids=device.cdi_device_ids,
            )
            if self._carries_share_id and device.share_id is not None:
                wire.share_id = device.share_id
        return entry

    def _finish(self, op: str, started: float, n_claims: int, n_errors: int) -> None:
        seconds = time.perf_counter() - started
        log = _log.bind(claims=n_claims, errors=n_errors, seconds=round(seconds, 6))
        if n_errors:
            log.warning("claims done with errors")
        else:
            log.info("claims done")
        if self._timing is not None:
            try:
                self._timing(op, seconds, n_errors)
            except Exception:
                _log.exception("timing hook failed")


def add_dra_services(
    server: grpc.Server,
    preparer: contract.ClaimPreparer,
    timing: TimingHook | None = None,
) -> tuple[str, ...]:
    """Register the v1 and v1beta1 DRAPlugin services; return their advertised names, v1 first."""
    v1 = DRAServicer(preparer, messages=v1_pb2, api_version=V1_SERVICE, carries_share_id=True, timing=timing)
    v1beta1 = DRAServicer(
        preparer, messages=v1beta1_pb2, api_version=V1BETA1_SERVICE, carries_share_id=False, timing=timing
    )
    wire.add_dra_v1(v1, server)
    wire.add_dra_v1beta1(v1beta1, server)
    return (V1_SERVICE, V1BETA1_SERVICE)
