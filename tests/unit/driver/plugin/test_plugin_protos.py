"""The generated protobuf code: kubelet's wire facts, and that regenerating changes nothing."""

from __future__ import annotations

import filecmp
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuplane.driver._proto.dra.v1 import api_pb2 as v1_pb2
from gpuplane.driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from gpuplane.driver._proto.drahealth.v1alpha1 import api_pb2 as health_pb2
from gpuplane.driver._proto.grpc.health.v1 import health_pb2 as grpc_health_pb2
from gpuplane.driver._proto.pluginregistration.v1 import api_pb2 as reg_pb2

ROOT = Path(__file__).resolve().parents[4]
PROTO_DIR = ROOT / "gpuplane" / "driver" / "_proto"


def _methods(module: object, service: str) -> list[str]:
    desc = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    return [f"/{desc.full_name}/{m.name}" for m in desc.methods]


def test_method_paths_match_kubelet() -> None:
    assert _methods(reg_pb2, "Registration") == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    ]
    for module, version in ((v1_pb2, "v1"), (v1beta1_pb2, "v1beta1")):
        assert _methods(module, "DRAPlugin") == [
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources",
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources",
        ]
    assert _methods(health_pb2, "DRAResourceHealth") == ["/v1alpha1.DRAResourceHealth/NodeWatchResources"]
    assert _methods(grpc_health_pb2, "Health") == [
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/List",
        "/grpc.health.v1.Health/Watch",
    ]


def _fields(message: object) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_field_numbers_match_kubelet() -> None:
    assert _fields(reg_pb2.PluginInfo) == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert _fields(reg_pb2.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    for module in (v1_pb2, v1beta1_pb2):
        assert _fields(module.Claim) == {"namespace": 1, "uid": 2, "name": 3}
        assert _fields(module.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
        assert _fields(module.NodeUnprepareResourceResponse) == {"error": 1}
        assert _fields(module.NodePrepareResourcesResponse) == {"claims": 1}
    base = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    assert _fields(v1beta1_pb2.Device) == base
    assert _fields(v1_pb2.Device) == {**base, "share_id": 5}
    assert v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence  # proto3 optional
    assert _fields(health_pb2.DeviceHealth) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert (health_pb2.UNKNOWN, health_pb2.HEALTHY, health_pb2.UNHEALTHY) == (0, 1, 2)


def test_v1_and_v1beta1_bytes_interchange_without_share_id() -> None:
    claim = v1_pb2.Claim(namespace="ns", uid="u", name="n")
    assert v1beta1_pb2.Claim.FromString(claim.SerializeToString()).uid == "u"


def _generated(root: Path) -> list[Path]:
    return sorted(
        p.relative_to(root)
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix in {".py", ".pyi"}
        and "src" not in p.relative_to(root).parts
        and "__pycache__" not in p.parts
    )


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_regenerating_changes_nothing() -> None:
    out = Path(tempfile.mkdtemp(prefix="gp-proto"))
    try:
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "gen_protos.sh"), str(out)],
            check=True,
            cwd=ROOT,
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            timeout=120,
        )
        committed, fresh = _generated(PROTO_DIR), _generated(out)
        assert fresh == committed
        _, mismatch, errors = filecmp.cmpfiles(PROTO_DIR, out, [str(p) for p in fresh], shallow=False)
        assert mismatch == [] and errors == [], f"stale generated code; run scripts/gen_protos.sh: {mismatch}"
    finally:
        shutil.rmtree(out, ignore_errors=True)
