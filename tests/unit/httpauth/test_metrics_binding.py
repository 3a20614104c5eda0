"""Metrics and health endpoints bind to localhost (or the pod IP the manifests pass), never to every interface.

The driver's metrics name claims, pods and GPU UUIDs (issue 18, defect 8); since issue 32 (defect 8) they want a
bearer token off loopback (tests/unit/httpauth/test_metrics_auth.py), and unauthenticated serving is loopback only.
The listening address is read back from the kernel (/proc/net/tcp), not from our own arguments.
"""

from __future__ import annotations

import socket
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from gpuplane.controller import metrics as controller_metrics
from gpuplane.driver import probes
from gpuplane.httpauth.settings import ServingSettings

ROOT = Path(__file__).resolve().parents[3]


def listening(port: int) -> set[str]:
    """Local IPv4 addresses with a socket listening on ``port``."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:
            out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_driver_metrics_without_a_host_bind_localhost() -> None:
    check = probes.Probes(stale_after_s=30)
    (server,) = probes.serve(":0", CollectorRegistry(), check, serving=ServingSettings(auth="none"))
    try:
        assert listening(server.port) == {"127.0.0.1"}
    finally:
        server.stop()


def test_controller_metrics_bind_localhost_by_default() -> None:
    port = free_port()
    server = controller_metrics.ControllerMetrics().serve(port, serving=ServingSettings(auth="none"))
    try:
        assert listening(port) == {"127.0.0.1"}
    finally:
        server.stop()


def _container(path: str) -> dict[str, object]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d]
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_manifests_bind_to_the_pod_ip() -> None:
    driver = _container("manifests/driver/daemonset.yaml")
    assert "--metrics-address=$(POD_IP):9400" in driver["args"]  # type: ignore[operator]
    controller = _container("manifests/controller/deployment.yaml")
    for c in (driver, controller):
        env = {e["name"]: e for e in c["env"]}  # type: ignore[attr-defined]
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        names = [e["name"] for e in c["env"]]  # type: ignore[attr-defined]
        users = [i for i, e in enumerate(c["env"]) if "$(POD_IP)" in str(e.get("value", ""))]  # type: ignore[attr-defined]
        assert all(names.index("POD_IP") < i for i in users)  # Kubernetes expands only variables defined earlier
    env = {e["name"]: e.get("value") for e in controller["env"]}  # type: ignore[attr-defined]
    assert env["GPUPLANE_METRICS_HOST"] == "$(POD_IP)" and env["GPUPLANE_LIVENESS"] == "http://$(POD_IP):8080/healthz"
    assert "0.0.0.0" not in (ROOT / "manifests/driver/daemonset.yaml").read_text()
    assert "0.0.0.0" not in (ROOT / "manifests/controller/deployment.yaml").read_text()
