"""Test kit for the crash tests: the driver as its own process, a node seen from kubelet's side, claim kinds.

:class:`Worker` runs ``tests/crash_worker.py`` (production DeviceState, checkpoint, CDI, MPS
manager with the stand-in binary, the file-backed simulator) and connects to it as kubelet does;
:class:`Node` holds the node's directories, arms the kill hook and reads the checkpoint back;
:func:`node_env` checks that no driver process and no MPS daemon outlives a test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuplane.api import names
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.plugin.kubelet_client import KubeletPluginClient
from gpuplane.driver.prepare import cdi
from gpuplane.driver.prepare.checkpoint import decode
from gpuplane.driver.prepare.contract import PrepareResult
from gpuplane.driver.sharing.mps import MpsControl
from testing.driverkit import STANDIN_MPS, FakeClaims, make_claim, mps_processes_under, ref, short_tmpdir, start_worker

REPO = Path(__file__).resolve().parents[1]
NODE = "node-a"
PROFILE = "hgx-h100"
GPU_CONFIG = {"apiVersion": names.CONFIG_API_VERSION, "kind": "GpuConfig"}
MPS_CONFIG = {**GPU_CONFIG, "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}}
TS_CONFIG = {**GPU_CONFIG, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}


# ----------------------------------------------------------------------------- processes
class Worker:
    """One driver process; ``client`` is kubelet's connection to it."""

    def __init__(self, root: Path, seq: int, instance: str = "") -> None:
        self.root = root
        self.log = root / f"worker-{seq}{instance}.log"
        extra = ["--log-level", "info", *(["--instance", instance] if instance else [])]
        self.proc, self.ready = start_worker(root, PROFILE, NODE, self.log, *extra)
        self.client = KubeletPluginClient.discover(self.ready["registration_socket"], timeout=30.0)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def prepare(self, claims: Sequence[Mapping[str, Any]]) -> dict[str, PrepareResult]:
        return self.client.prepare([ref(c) for c in claims])

    def unprepare(self, claims: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        return {uid: r.error for uid, r in self.client.unprepare([ref(c) for c in claims]).items()}

    def expect_killed(self) -> None:
        rc = self.proc.wait(10)
        self.client.close()
        assert rc == -signal.SIGKILL, f"driver exited with {rc}, not by SIGKILL:\n{self.log_text()[-3000:]}"

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(15) == 0


@dataclass
class Node:
    """One simulated node's directories, seen from kubelet's (the test's) side."""

    root: Path
    workers: list[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sim = Simulator(SimConfig(profile=PROFILE, state_dir=self.root / "sim", node_name=NODE))
        self.sim.init()
        self.claims = FakeClaims(self.root / "claims.json")
        self.mps = MpsControl(self.root / "p" / "mps", STANDIN_MPS)

    def start(self, instance: str = "") -> Worker:
        self.disarm()
        w = Worker(self.root, len(self.workers), instance)
        self.workers.append(w)
        return w

    def arm(self, step: str, nth: int) -> None:
        tmp = self.root / ".kill-at.tmp"
        tmp.write_text(json.dumps({"step": step, "nth": nth}))
        os.replace(tmp, self.root / "kill-at")

    def disarm(self) -> None:
        (self.root / "kill-at").unlink(missing_ok=True)

    def steps(self) -> list[str]:
        path = self.root / "steps.log"
        return [line.split(" ", 1)[1] for line in path.read_text().splitlines()] if path.exists() else []

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    def checkpoint(self) -> dict[str, Any]:
        """The checkpoint as decoded from the bytes on disk (fails on a torn or corrupt file)."""
        path = self.root / "p" / "checkpoint.json"
        if not path.exists():
            return {}
        return {uid: rec for uid, rec in decode(path.read_bytes()).claims.items()}

    def instances(self) -> dict[str, list[Any]]:
        return {g.uuid: list(self.sim.gpu_instances(g.uuid)) for g in self.sim.gpus()}


@contextmanager
def node_env() -> Iterator[Node]:
    """A fresh node directory; at the end no driver process and no MPS daemon may be left."""
    root = short_tmpdir("gpc")
    n = Node(root)
    try:
        yield n
        alive = [w.proc.pid for w in n.workers if w.proc.poll() is None]
        leaked = mps_processes_under(root)
        for w in n.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(5)
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
        assert not alive, f"driver processes left running: {alive}"
        assert not leaked, f"MPS daemons left running: {leaked}"
    finally:
        for w in n.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(5)
            if w.proc.stdout is not None:
                w.proc.stdout.close()
        for pid in mps_processes_under(root):
            os.kill(pid, signal.SIGKILL)
        n.sim.shutdown()
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------------------ claims
@dataclass(frozen=True)
class Kind:
    name: str
    devices: tuple[str, ...]
    config: tuple[Mapping[str, Any], ...] = ()

    def claim(self) -> dict[str, Any]:
        uid = f"{self.name}-{hashlib.sha256(self.name.encode()).hexdigest()[:12]}"
        return make_claim(self.name, NODE, list(self.devices), uid=uid, claim_config=list(self.config))

    @property
    def mig_devices(self) -> list[str]:
        return [d for d in self.devices if "-mig-" in d]


KINDS = [
    Kind("whole", ("gpu-1",)),
    Kind("mig", ("gpu-2-mig-3g-40gb-4",)),
    Kind("mig-pair", ("gpu-3-mig-3g-40gb-0", "gpu-4-mig-2g-20gb-2")),
    Kind("mps", ("gpu-5",), (MPS_CONFIG,)),
    Kind("timeslice", ("gpu-6",), (TS_CONFIG,)),
]


def kill_points(steps: Sequence[str]) -> list[tuple[str, int]]:
    seen: dict[str, int] = {}
    points = []
    for s in steps:
        seen[s] = seen.get(s, 0) + 1
        points.append((s, seen[s]))
    return points


# ----------------------------------------------------------------------------- checks
def assert_no_orphans(n: Node) -> None:
    """What a restarted driver leaves: nothing that no prepared claim owns, nothing half-prepared."""
    cp = n.checkpoint()
    assert all(r.phase == "PrepareCompleted" for r in cp.values()), {u: r.phase for u, r in cp.items()}
    owned = {
        (d.mig.parent_uuid, d.mig.gi_id) for r in cp.values() for d in r.devices if d.mig and d.mig.gi_id is not None
    }
    present = {(uuid, gi.gi_id) for uuid, gis in n.instances().items() for gi in gis}
    assert present <= owned, f"MIG instances no claim owns: {present - owned}"
    with_daemon = {u for u, r in cp.items() if r.mps_daemon}
    assert {d.claim_uid for d in n.mps.list_daemons()} <= with_daemon
    assert len(mps_processes_under(n.root)) <= len(with_daemon)
    assert set(cdi.list_claim_specs(n.cdi_root)) <= set(cp)


def assert_prepared(n: Node, kind: Kind, claim: Mapping[str, Any], result: PrepareResult) -> None:
    uid = claim["metadata"]["uid"]
    assert result.error == "", result.error
    assert sorted(d.device_name for d in result.devices) == sorted(kind.devices)
    spec = cdi.spec_path(n.cdi_root, uid)
    assert sorted(n.cdi_root.glob("*.json")) == [spec]
    for d in result.devices:
        (cdi_id,) = d.cdi_device_ids
        assert cdi.resolve(n.cdi_root, cdi_id) == spec
    doc = json.loads(spec.read_text())
    cp = n.checkpoint()
    assert list(cp) == [uid] and cp[uid].phase == "PrepareCompleted" and cp[uid].cdi_spec == str(spec)
    # MIG: exactly one instance per MIG device, complete, the one the checkpoint records, its caps in the spec.
    instances = n.instances()
    assert sum(len(gis) for gis in instances.values()) == len(kind.mig_devices)
    for rec in cp[uid].devices:
        if rec.mig is None:
            continue
        (gi,) = [g for g in instances[rec.mig.parent_uuid] if g.placement_start == rec.mig.start]
        assert gi.gi_id == rec.mig.gi_id and gi.profile_id == rec.mig.profile_id
        assert gi.compute_instances and gi.mig_uuid == rec.mig.mig_uuid
        entry = next(e for e in doc["devices"] if e["name"] == cdi.cdi_device_name(uid, rec.device))
        nodes = {x["path"] for x in entry["containerEdits"]["deviceNodes"]}
        caps = {f"/dev/nvidia-caps/nvidia-cap{m}" for m in (gi.gi_caps_minor, gi.ci_caps_minor)}
        assert caps <= nodes, f"MIG caps device nodes missing from the CDI spec: {caps - nodes}"
    # MPS: exactly one daemon, running, and the spec points the containers at it.
    daemons = n.mps.list_daemons()
    procs = mps_processes_under(n.root)
    if kind.name == "mps":
        assert [d.claim_uid for d in daemons] == [uid] and daemons[0].pid is not None
        assert procs == [daemons[0].pid]
        assert "CUDA_MPS_PIPE_DIRECTORY=/run/gpuplane/mps/pipe" in doc["containerEdits"]["env"]
    else:
        assert daemons == [] and procs == []
    if kind.name == "timeslice":
        assert n.sim.timeslice(n.sim.uuid_of_minor(6)) == "Long"


def assert_clean(n: Node) -> None:
    assert list(n.cdi_root.glob("*.json")) == []
    assert n.checkpoint() == {}
    assert all(gis == [] for gis in n.instances().values()), n.instances()
    assert n.mps.list_daemons() == [] and mps_processes_under(n.root) == []
    assert not any((n.root / "p" / "mps").glob("*")), "MPS claim directories left behind"
    assert all(n.sim.timeslice(g.uuid) == "Default" for g in n.sim.gpus())


def ok_unprepare(w: Worker, claim: Mapping[str, Any]) -> None:
    assert w.unprepare([claim]) == {claim["metadata"]["uid"]: ""}


def start_with_mixed(node: Node) -> tuple[Worker, list[dict[str, Any]]]:
    """A driver with a whole GPU, a MIG device and an MPS claim prepared (claims known before it starts)."""
    claims = [KINDS[0].claim(), KINDS[1].claim(), KINDS[3].claim()]
    node.claims.add(*claims)
    w = node.start()
    results = w.prepare(claims)
    assert all(r.error == "" for r in results.values()), results
    return w, claims
