"""One log line per call the driver's sockets receive, with the request's fields.

Every RPC from kubelet (registration, DRA prepare/unprepare, the health stream,
gRPC health checks) is logged at INFO as ``kubelet call`` with the full method
name and the request as a dict (protobuf field names), before the servicer runs.
Kubelet calls the driver a few times per pod, so this costs little, and it is the
record an operator (and the e2e conformance test, which compares a real
kubelet's calls with the stand-in's) reads to see exactly what kubelet asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from google.protobuf import json_format

_log = structlog.get_logger(__name__)

CALL_EVENT = "kubelet call"


def request_fields(request: Any) -> dict[str, Any]:
    """The request message as a dict (field names as in the .proto; defaults included)."""
    try:
        fields: dict[str, Any] = json_format.MessageToDict(
            request, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    except Exception:  # not a protobuf message: log what it is
        return {"unparsed": type(request).__name__}
    return fields


if TYPE_CHECKING:  # the stubs make the interceptor generic; grpc's own class is not subscriptable
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


class CallLog(_Interceptor):
    """Logs each unary-request call (unary or streaming response) with its request, then runs it."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method)
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                _log.info(CALL_EVENT, method=method, request=request_fields(request))
                return inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def stream(request: Any, context: grpc.ServicerContext) -> Any:
                _log.info(CALL_EVENT, method=method, request=request_fields(request))
                return inner_stream(request, context)

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
