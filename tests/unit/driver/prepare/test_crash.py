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

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from gpuplane.driver.prepare import cdi
from tests.crashkit import (
    KINDS,
    REPO,
    Kind,
    Node,
    Worker,
    assert_clean,
    assert_no_orphans,
    assert_prepared,
    kill_points,
    node_env,
    ok_unprepare,
)


@pytest.fixture
def node() -> Iterator[Node]:
    with node_env() as n:
        yield n


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
    ok_unprepare(w, claim)
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

    prepare_points = kill_points(prepare_steps)
    unprepare_points = kill_points(unprepare_steps)
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
        ok_unprepare(w, claim)
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
    ok_unprepare(w, claim)
    w.stop()
    assert_clean(node)


# The production state with a hook live during recover(): dies at the first destroyed GPU instance.
_RECOVER_AND_DIE = """
import os, signal, sys
from pathlib import Path
from testing.driverkit import FakeClaims, build_driver
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
    ok_unprepare(w, claim)
    w.stop()
    assert_clean(node)
