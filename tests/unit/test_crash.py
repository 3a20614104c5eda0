"""Crash safety of the node driver: SIGKILL at every durable step of prepare and unprepare, then restart.

The driver runs as a separate process (``tests/crash_worker.py``: production
DeviceState, checkpoint, CDI, MPS manager with the stand-in binary, the
file-backed simulator whose MIG state outlives the process, and the real
kubelet sockets). This test plays kubelet: it calls NodePrepareResources /
NodeUnprepareResources with :class:`KubeletPluginClient`, has the driver kill
itself at a chosen step, starts a fresh driver (which runs ``recover()``) and
repeats the call, as kubelet does until it succeeds.

The steps are not listed here: each claim kind is first run once with the hook
only recording, and every (step, occurrence) it passed through becomes a kill
point. After every restart the recovered state must hold no orphan (every MIG
instance, MPS daemon and CDI spec belongs to a claim the checkpoint records as
prepared, no claim is left half-prepared); after the repeated call the claim is
fully prepared or fully gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuplane.driver.api import names
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.plugin.kubelet_client import KubeletPluginClient
from gpuplane.driver.prepare import cdi
from gpuplane.driver.prepare.checkpoint import CheckpointStore, decode
from gpuplane.driver.prepare.contract import PrepareResult
from gpuplane.driver.sharing.mps import MpsControl
from tests.driverkit import STANDIN_MPS, FakeClaims, build_driver, make_claim, mps_processes_under, ref, short_tmpdir

REPO = Path(__file__).resolve().parents[2]
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
        args = [sys.executable, "-m", "tests.crash_worker", "--root", str(root), "--profile", PROFILE]
        args += ["--node", NODE, "--log-level", "info"]
        if instance:
            args += ["--instance", instance]
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=err)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise AssertionError(f"driver exited at start ({self.proc.returncode}):\n{self.log_text()[-3000:]}")
        self.ready: dict[str, Any] = json.loads(line)
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


@pytest.fixture
def node() -> Iterator[Node]:
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


def _kill_points(steps: Sequence[str]) -> list[tuple[str, int]]:
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


# ------------------------------------------------------------------------------- tests
def _ok_unprepare(w: Worker, claim: Mapping[str, Any]) -> None:
    assert w.unprepare([claim]) == {claim["metadata"]["uid"]: ""}


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_sigkill_at_every_step(node: Node, kind: Kind) -> None:
    claim = kind.claim()
    uid = claim["metadata"]["uid"]
    node.claims.add(claim)

    # A recording run: which steps do prepare and unprepare pass through?
    w = node.start()
    reference = w.prepare([claim])[uid]
    assert_prepared(node, kind, claim, reference)
    prepare_steps = node.steps()
    _ok_unprepare(w, claim)
    unprepare_steps = node.steps()[len(prepare_steps) :]
    assert_clean(node)
    assert prepare_steps[-1] == "prepare:completed-recorded" and "prepare:cdi-written" in prepare_steps
    assert unprepare_steps[0] == "undo:cdi-removed" and unprepare_steps[-1] == "undo:record-removed"
    if kind.mig_devices:
        assert prepare_steps.count("prepare:started-recorded") == 1
        for step in ("prepare:gi-created", "prepare:gi-recorded", "prepare:ci-created"):
            assert prepare_steps.count(step) == len(kind.mig_devices), (step, prepare_steps)
        assert unprepare_steps.count("undo:gi-destroyed") == len(kind.mig_devices)
    if kind.name == "mps":
        assert {"prepare:mps-recorded", "prepare:mps-started"} <= set(prepare_steps)
        assert "undo:mps-stopped" in unprepare_steps

    prepare_points = _kill_points(prepare_steps)
    unprepare_points = _kill_points(unprepare_steps)
    killed = 0

    def crash(op: str, point: tuple[str, int]) -> Worker:
        nonlocal w, killed
        node.arm(*point)
        with pytest.raises(grpc.RpcError):
            (w.prepare if op == "prepare" else w.unprepare)([claim])
        w.expect_killed()
        killed += 1
        w = node.start()  # disarms first: recovery and the repeated call run unhurt
        assert_no_orphans(node)
        return w

    for i in range(max(len(prepare_points), len(unprepare_points))):
        if i < len(prepare_points):
            w = crash("prepare", prepare_points[i])
        result = w.prepare([claim])[uid]  # kubelet repeats the call (or, past the prepare points, just prepares)
        assert_prepared(node, kind, claim, result)
        assert result == reference
        if i < len(unprepare_points):
            w = crash("unprepare", unprepare_points[i])
        _ok_unprepare(w, claim)
        assert_clean(node)
    w.stop()
    assert killed == len(prepare_points) + len(unprepare_points)


def test_kill_during_recovery_rollback(node: Node) -> None:
    """A crash while start-up rolls back a half-made MIG claim, then another start: still no leak."""
    kind = KINDS[2]
    claim = kind.claim()
    node.claims.add(claim)
    w = node.start()
    node.arm("prepare:ci-created", 2)  # second MIG device's compute instance made, nothing else
    with pytest.raises(grpc.RpcError):
        w.prepare([claim])
    w.expect_killed()
    assert sum(len(g) for g in node.instances().values()) == 2
    # The next start rolls back; kill it after the first instance is destroyed, before the record goes.
    node.disarm()
    env_root = node.root
    args = [sys.executable, "-c", _RECOVER_AND_DIE, str(env_root)]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, timeout=30, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert node.checkpoint()[claim["metadata"]["uid"]].phase == "PrepareStarted"
    w = node.start()
    assert w.ready["recover"]["rolled_back"] == 1
    assert_no_orphans(node)
    assert_clean(node)
    result = w.prepare([claim])[claim["metadata"]["uid"]]
    assert_prepared(node, kind, claim, result)
    _ok_unprepare(w, claim)
    w.stop()
    assert_clean(node)


# The production state with a hook live during recover(): dies at the first destroyed GPU instance.
_RECOVER_AND_DIE = """
import os, signal, sys
from pathlib import Path
from tests.driverkit import FakeClaims, build_driver
root = Path(sys.argv[1])
def hook(step):
    if step == "undo:gi-destroyed":
        os.kill(os.getpid(), signal.SIGKILL)
drv = build_driver(root, "hgx-h100", "node-a", claims=FakeClaims(root / "claims.json"), fault_hook=hook)
drv.state.recover()
"""


def test_spec_rebuilt_after_restart_keeps_mig_caps(node: Node) -> None:
    """The CDI spec of a prepared MIG claim vanished (tmpfs) and the driver restarted: the rebuild is complete."""
    kind = KINDS[1]
    claim = kind.claim()
    uid = claim["metadata"]["uid"]
    node.claims.add(claim)
    w = node.start()
    first = w.prepare([claim])[uid]
    spec = cdi.spec_path(node.cdi_root, uid)
    original = json.loads(spec.read_text())
    w.stop()
    spec.unlink()
    w = node.start()
    assert w.prepare([claim])[uid] == first
    assert json.loads(spec.read_text()) == original
    assert_prepared(node, kind, claim, first)
    _ok_unprepare(w, claim)
    w.stop()
    assert_clean(node)


def _start_with_mixed(node: Node) -> tuple[Worker, list[dict[str, Any]]]:
    """A driver with a whole GPU, a MIG device and an MPS claim prepared (claims known before it starts)."""
    claims = [KINDS[0].claim(), KINDS[1].claim(), KINDS[3].claim()]
    node.claims.add(*claims)
    w = node.start()
    results = w.prepare(claims)
    assert all(r.error == "" for r in results.values()), results
    return w, claims


def test_corrupt_checkpoint_is_survived_and_rebuilt(node: Node) -> None:
    w, claims = _start_with_mixed(node)
    before = {c["metadata"]["uid"]: w.prepare([c])[c["metadata"]["uid"]] for c in claims}
    w.proc.kill()
    w.proc.wait(5)
    w.client.close()
    path = node.root / "p" / "checkpoint.json"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))

    w = node.start()
    assert w.ready["recover"]["rebuilt"] == 3
    assert "checkpoint corrupt" in w.log_text()
    aside = list(path.parent.glob("checkpoint.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)
    cp = node.checkpoint()
    assert set(cp) == set(before) and all(r.phase == "PrepareCompleted" for r in cp.values())
    # Same answers, the MIG instance adopted (not a second one), the MPS daemon kept (not a second one).
    assert {c["metadata"]["uid"]: w.prepare([c])[c["metadata"]["uid"]] for c in claims} == before
    assert sum(len(g) for g in node.instances().values()) == 1
    assert len(node.mps.list_daemons()) == 1 and len(mps_processes_under(node.root)) == 1
    assert_no_orphans(node)
    assert all(e == "" for e in w.unprepare(claims).values())
    w.stop()
    # The claim's CDI spec named the MIG instance the driver made, so the rebuilt claim owns it again and
    # unprepare destroys it (instead of keeping it as an administrator's fixed instance).
    assert sum(len(g) for g in node.instances().values()) == 0
    assert list(node.cdi_root.glob("*.json")) == [] and node.checkpoint() == {}
    assert node.mps.list_daemons() == [] and mps_processes_under(node.root) == []


def test_reboot_drops_prepared_state(node: Node) -> None:
    w, claims = _start_with_mixed(node)
    w.proc.kill()
    w.proc.wait(5)
    w.client.close()
    old_boot = w.ready["boot_id"]
    assert node.sim.reboot() != old_boot
    for pid in mps_processes_under(node.root):  # a reboot ends every process
        os.kill(pid, signal.SIGKILL)
    w = node.start()
    assert w.ready["boot_id"] != old_boot
    assert node.checkpoint() == {}
    assert list(node.cdi_root.glob("*.json")) == [], "stale CDI specs survived the reboot"
    assert not any((node.root / "p" / "mps").glob("*"))
    # kubelet prepares again after the reboot: everything is made anew.
    results = w.prepare(claims)
    assert all(r.error == "" for r in results.values())
    assert sum(len(g) for g in node.instances().values()) == 1 and len(mps_processes_under(node.root)) == 1
    assert all(e == "" for e in w.unprepare(claims).values())
    w.stop()
    assert_clean(node)


def _rewrite_payload(path: Path, version: int, edit: Any) -> None:
    _header, _, payload = path.read_bytes().partition(b"\n")
    raw = edit(json.loads(payload))
    body = json.dumps(raw).encode()
    path.write_bytes(f"gpuplane-checkpoint v{version} sha256={hashlib.sha256(body).hexdigest()}\n".encode() + body)


def test_newer_writer_fields_are_ignored() -> None:
    root = short_tmpdir("gpn")
    try:
        drv = build_driver(root, PROFILE, NODE)
        claim = KINDS[1].claim()
        uid = claim["metadata"]["uid"]
        drv.claims.add(claim)
        first = drv.state.prepare([ref(claim)])[uid]
        assert first.error == ""

        def add_fields(raw: dict[str, Any]) -> dict[str, Any]:
            raw["version"] = 3
            raw["nodeTopology"] = {"numa": [0, 1]}
            raw["claims"][uid]["leaseHolder"] = "pod-b"
            raw["claims"][uid]["devices"][0]["health"] = {"xid": 0}
            return raw

        _rewrite_payload(drv.state.settings.checkpoint_path, 3, add_fields)
        loaded = CheckpointStore(drv.state.settings.checkpoint_path, drv.sim.boot_id()).load()
        assert not loaded.corrupt and loaded.checkpoint.claims[uid].phase == "PrepareCompleted"
        fresh = build_driver(root, PROFILE, NODE, claims=drv.claims)
        stats = fresh.state.recover()
        assert stats["rebuilt"] == 0 and stats["rolled_back"] == 0 and stats["cdi_removed"] == 0
        gets = drv.claims.gets
        assert fresh.state.prepare([ref(claim)])[uid] == first
        assert drv.claims.gets == gets, "answered from the checkpoint"
        assert not list(root.glob("p/*.corrupt-*"))
        assert fresh.state.unprepare([ref(claim)])[uid].error == ""
        assert all(not drv.sim.gpu_instances(g.uuid) for g in drv.sim.gpus())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_v1_checkpoint_migrates() -> None:
    root = short_tmpdir("gpv")
    try:
        drv = build_driver(root, PROFILE, NODE)
        claim = KINDS[0].claim()
        uid = claim["metadata"]["uid"]
        drv.claims.add(claim)
        first = drv.state.prepare([ref(claim)])[uid]

        def to_v1(raw: dict[str, Any]) -> dict[str, Any]:
            claims = []
            for rec in raw["claims"].values():
                rec["state"] = rec.pop("phase")
                claims.append(rec)
            return {"version": 1, "boot_id": raw["boot_id"], "claims": claims}

        _rewrite_payload(drv.state.settings.checkpoint_path, 1, to_v1)
        assert b'"state": "PrepareCompleted"' in drv.state.settings.checkpoint_path.read_bytes()
        fresh = build_driver(root, PROFILE, NODE, claims=drv.claims)
        stats = fresh.state.recover()
        assert stats["cdi_removed"] == 0 and stats["rebuilt"] == 0
        cp = decode(drv.state.settings.checkpoint_path.read_bytes())  # rewritten as v2 by recover
        assert cp.version == 2 and cp.claims[uid].phase == "PrepareCompleted"
        assert drv.state.settings.checkpoint_path.read_bytes().startswith(b"gpuplane-checkpoint v2 ")
        assert fresh.state.prepare([ref(claim)])[uid] == first
        assert fresh.state.unprepare([ref(claim)])[uid].error == ""
        assert list((root / "cdi").glob("*.json")) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_two_plugin_instances_never_corrupt_the_checkpoint(node: Node) -> None:
    """A rolling update: two driver processes on the same node directories, preparing at once."""
    ts_claims = [
        make_claim(f"ts-{g}-{k}", NODE, [{"device": f"gpu-{g}", "shareID": f"s{g}{k}"}], claim_config=[TS_CONFIG])
        for g in range(4)
        for k in range(3)
    ]
    mig_claims = [make_claim(f"mig-{g}-{s}", NODE, [f"gpu-{g}-mig-3g-40gb-{s}"]) for g in range(4, 8) for s in (0, 4)]
    node.claims.add(*ts_claims, *mig_claims)
    old = node.start("old")
    new = node.start("new")
    errors: list[str] = []

    def run(w: Worker, claims: Sequence[Mapping[str, Any]], op: str) -> None:
        for c in claims:
            try:
                if op == "prepare":
                    errors.extend(r.error for r in w.prepare([c]).values() if r.error)
                else:
                    errors.extend(e for e in w.unprepare([c]).values() if e)
            except grpc.RpcError as exc:
                errors.append(str(exc))

    for op in ("prepare", "unprepare"):
        threads = [
            threading.Thread(target=run, args=(old, ts_claims, op)),
            threading.Thread(target=run, args=(new, mig_claims, op)),
            threading.Thread(target=run, args=(new, ts_claims[::-1], op)),  # the same claims from both sides
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert errors == []
        cp = node.checkpoint()
        if op == "prepare":
            assert set(cp) == {c["metadata"]["uid"] for c in ts_claims + mig_claims}
            assert all(r.phase == "PrepareCompleted" for r in cp.values())
            assert len(list(node.cdi_root.glob("*.json"))) == len(cp)
            assert sum(len(g) for g in node.instances().values()) == len(mig_claims)
        else:
            assert cp == {}
    old.stop()
    new.stop()
    assert_clean(node)
