"""Crash recovery of the node driver's checkpoint: a corrupt file, a reboot, files of other versions, two writers.

The driver runs as its own process (:mod:`tests.crashkit`), or in this one where only the
checkpoint is under test. After a corrupt checkpoint the claims prepared here are rebuilt from the
API and their CDI specs; after a reboot nothing prepared survives; a newer writer's extra fields
are ignored and a v1 file migrates; two plugin instances never tear the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuplane.driver.prepare.checkpoint import CheckpointStore, decode
from testing.driverkit import build_driver, make_claim, mps_processes_under, ref, short_tmpdir
from tests.crashkit import (
    KINDS,
    NODE,
    PROFILE,
    TS_CONFIG,
    Node,
    Worker,
    assert_clean,
    assert_no_orphans,
    node_env,
    start_with_mixed,
)


@pytest.fixture
def node() -> Iterator[Node]:
    with node_env() as n:
        yield n


def test_corrupt_checkpoint_is_survived_and_rebuilt(node: Node) -> None:
    w, claims = start_with_mixed(node)
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
    w, claims = start_with_mixed(node)
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
