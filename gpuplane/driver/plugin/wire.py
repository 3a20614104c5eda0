"""Typed handles on the generated gRPC modules in ``gpuplane.driver._proto``.

grpcio-tools writes ``*_pb2_grpc.py`` without annotations, so mypy --strict
refuses to call into them. This module names each generated function the
layer uses once, with a type, so the servicers and the client stay strict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from gpuplane.driver._proto.dra.v1 import api_pb2_grpc as _dra_v1_grpc
from gpuplane.driver._proto.dra.v1beta1 import api_pb2_grpc as _dra_v1beta1_grpc
from gpuplane.driver._proto.drahealth.v1alpha1 import api_pb2_grpc as _drahealth_grpc
from gpuplane.driver._proto.grpc.health.v1 import health_pb2_grpc as _grpc_health_grpc
from gpuplane.driver._proto.pluginregistration.v1 import api_pb2_grpc as _reg_grpc

AddServicer = Callable[[Any, grpc.Server], None]
NewStub = Callable[[grpc.Channel], Any]

add_dra_v1: AddServicer = _dra_v1_grpc.add_DRAPluginServicer_to_server
add_dra_v1beta1: AddServicer = _dra_v1beta1_grpc.add_DRAPluginServicer_to_server
add_registration: AddServicer = _reg_grpc.add_RegistrationServicer_to_server
add_resource_health: AddServicer = _drahealth_grpc.add_DRAResourceHealthServicer_to_server
add_grpc_health: AddServicer = _grpc_health_grpc.add_HealthServicer_to_server

dra_v1_stub: NewStub = _dra_v1_grpc.DRAPluginStub
dra_v1beta1_stub: NewStub = _dra_v1beta1_grpc.DRAPluginStub
registration_stub: NewStub = _reg_grpc.RegistrationStub
resource_health_stub: NewStub = _drahealth_grpc.DRAResourceHealthStub
grpc_health_stub: NewStub = _grpc_health_grpc.HealthStub
