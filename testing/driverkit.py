"""Test kit for the node driver: claim builders, an in-memory claim source, and a driver on the simulator.

The claim source is a fake of the API server (fine for fast unit tests; the e2e
suite proves the same paths against a real one). Everything else is production
code: the simulator backend, DeviceState, the MPS manager with the stand-in
binary, and, where asked, the real gRPC sockets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid as uuidlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplane.api import names
from gpuplane.driver import host
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.kube import NotFound
from gpuplane.driver.plugin.server import PluginServer
from gpuplane.driver.prepare.contract import ClaimRef
from gpuplane.driver.prepare.state import DeviceState, StateSettings
from gpuplane.driver.sharing.mps import MpsControl

REPO = Path(__file__).resolve().parents[1]
STANDIN_MPS = str(REPO / "tests" / "fakes" / "nvidia-cuda-mps-control")  # NVIDIA binaries stand-ins: tests/fakes


def make_claim(
    name: str,
    node: str,
    devices: Sequence[str | tuple[str, str] | Mapping[str, Any]],
    *,
    namespace: str = "default",
    uid: str | None = None,
    class_config: Sequence[Mapping[str, Any]] = (),
    claim_config: Sequence[Mapping[str, Any]] = (),
    allocated: bool = True,
    driver: str = names.DRIVER_NAME,
) -> dict[str, Any]:
    """A ResourceClaim as the API returns it after the scheduler allocated ``devices``.

    A device is a name (request "gpu"), a (request, name) pair, or a full result dict.
    """
    results: list[dict[str, Any]] = []
    for d in devices:
        if isinstance(d, str):
            results.append({"request": "gpu", "driver": driver, "pool": node, "device": d})
        elif isinstance(d, tuple):
            results.append({"request": d[0], "driver": driver, "pool": node, "device": d[1]})
        else:
            results.append({"driver": driver, "pool": node, "request": "gpu", **d})
    config = [
        {"source": source, "requests": [], "opaque": {"driver": driver, "parameters": dict(c)}}
        for source, configs in (("FromClass", class_config), ("FromClaim", claim_config))
        for c in configs
    ]
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuidlib.uuid4())},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {"devices": {"results": results, "config": config}}
    return obj


def ref(claim: Mapping[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])


class FakeClaims:
    """In-memory stand-in for the API server's ResourceClaims (also recording events)."""

    def __init__(self, path: Path | None = None) -> None:
        self._claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.gets = 0
        self._lock = threading.Lock()
        self._path = path  # optional JSON file so another process sees the same claims
        if path is not None and path.exists():
            for obj in json.loads(path.read_text()):
                self._claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    def _save(self) -> None:
        if self._path is not None:
            self._path.write_text(json.dumps(list(self._claims.values())))

    def add(self, *claims: dict[str, Any]) -> None:
        with self._lock:
            for c in claims:
                self._claims[(c["metadata"]["namespace"], c["metadata"]["name"])] = c
            self._save()

    def delete(self, claim: Mapping[str, Any]) -> None:
        with self._lock:
            self._claims.pop((claim["metadata"]["namespace"], claim["metadata"]["name"]), None)
            self._save()

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            self.gets += 1
            obj = self._claims.get((namespace, name))
        if obj is None:
            raise NotFound(f"ResourceClaim {namespace}/{name} not found")
        copy: dict[str, Any] = json.loads(json.dumps(obj))  # a fresh copy, as a GET would be
        return copy

    def list_claims(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(o)) for o in self._claims.values()]

    def claim_event(self, claim: Mapping[str, Any], reason: str, message: str, warning: bool = True) -> None:
        self.events.append((claim.get("metadata", {}).get("name", ""), reason, message))


@dataclass
class DriverUnderTest:
    root: Path
    node: str
    sim: Simulator
    claims: FakeClaims
    state: DeviceState
    mps: MpsControl

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    def cdi_files(self) -> list[Path]:
        return sorted(self.cdi_root.glob("*.json"))


def short_tmpdir(prefix: str = "gp") -> Path:
    """Unix socket paths must stay under 108 bytes: use a short directory under /tmp."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def state_settings(root: Path, node: str, boot_id: str) -> StateSettings:
    """The driver's settings for a test node under ``root`` (CDI, checkpoint and lock as the e2e nodes lay them out)."""
    return StateSettings(
        node_name=node,
        driver_name=names.DRIVER_NAME,
        cdi_root=root / "cdi",
        checkpoint_path=root / "p" / "checkpoint.json",
        lock_path=root / "p" / "pu.lock",
        boot_id=boot_id,
    )


def build_driver(
    root: Path,
    profile: str = "hgx-h100",
    node: str = "node-a",
    *,
    claims: FakeClaims | None = None,
    fault_hook: Any = None,
    sim_overrides: Mapping[str, Any] | None = None,
) -> DriverUnderTest:
    sim = Simulator(SimConfig(profile=profile, state_dir=root / "sim", node_name=node, **dict(sim_overrides or {})))
    sim.init()
    claims = claims or FakeClaims()
    mps = MpsControl(root / "p" / "mps", STANDIN_MPS)
    state = DeviceState(state_settings(root, node, sim.boot_id()), sim, claims, mps, fault_hook=fault_hook)
    return DriverUnderTest(root=root, node=node, sim=sim, claims=claims, state=state, mps=mps)


@contextmanager
def driver_env(
    profile: str = "hgx-h100", node: str = "node-a", *, prefix: str = "gp", **sim_overrides: Any
) -> Iterator[DriverUnderTest]:
    """A driver on the simulator in a short temporary directory; afterwards its daemons stop, the directory goes."""
    root = short_tmpdir(prefix)
    drv = build_driver(root, profile, node, sim_overrides=sim_overrides)
    try:
        yield drv
    finally:
        for d in drv.mps.list_daemons():
            drv.mps.stop(d.claim_uid)
        drv.sim.shutdown()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def simulator(
    profile: str, node: str = "node-a", *, prefix: str = "sl", in_memory: bool = False, **overrides: Any
) -> Iterator[Simulator]:
    """A bare simulator (no fsync) in a temporary directory, in /dev/shm when ``in_memory`` and writable."""
    shm = "/dev/shm" if in_memory and os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=shm)) if shm else short_tmpdir(prefix)
    sim = Simulator(SimConfig(profile=profile, state_dir=root, node_name=node, durable=False, **overrides))
    sim.init()
    try:
        yield sim
    finally:
        sim.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def mps_processes_under(root: Path) -> list[int]:
    """Live processes whose CUDA_MPS_PIPE_DIRECTORY lies under ``root`` (the MPS daemons of a test)."""
    prefix = f"{root}/"
    return [
        pid
        for pid in host.proc_pids()
        if host.proc_running(pid) and (host.proc_environ(pid, "CUDA_MPS_PIPE_DIRECTORY") or "").startswith(prefix)
    ]


@contextmanager
def serving(drv: DriverUnderTest) -> Iterator[PluginServer]:
    server = PluginServer(names.DRIVER_NAME, drv.state, registry_dir=drv.root / "reg", plugin_dir=drv.root / "plug")
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=1.0)


def start_worker(
    root: Path, profile: str, node: str, log: Path, *extra: str
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start the driver as its own process (``tests/crash_worker.py``); its first stdout line says where it serves.

    RuntimeError with the log's tail when it exits before saying so.
    """
    args = [
        sys.executable,
        "-m",
        "tests.crash_worker",
        "--root",
        str(root),
        "--profile",
        profile,
        "--node",
        node,
        *extra,
    ]
    with open(log, "ab") as err:
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"driver exited at start ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
    ready: dict[str, Any] = json.loads(line)
    return proc, ready


def prepare_cdi(
    d: DriverUnderTest, name: str, node: str, uid: str, device: str, *, labels: Mapping[str, str] | None = None
) -> tuple[str, dict[str, Any]]:
    """Prepare a claim (namespace ``team``) for ``device``: its error, or "" and its CDI spec as written."""
    c = make_claim(name, node, [device], namespace="team", uid=uid)
    if labels:
        c["metadata"].setdefault("labels", {}).update(labels)
    d.claims.add(c)
    result = d.state.prepare([ref(c)])[uid]
    if result.error:
        return result.error, {}
    (spec_file,) = [p for p in d.cdi_files() if uid in p.name]
    return "", json.loads(spec_file.read_text())
