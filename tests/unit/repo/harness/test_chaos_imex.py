"""The chaos e2e's IMEX invariants (``e2e.plane.chaos_imex``): a consistent reading passes, and each can fail."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from e2e.plane import chaos_imex, imex_gangs
from e2e.plane.chaos_invariants import Verdict
from e2e.plane.simnode_plan import SimNode
from gpuplane.api import names

NS, TRAYS = "chaos", ("gb200-0", "gb200-1")
CH = chaos_imex.CHANNELS


def reading() -> dict[str, Any]:
    """One gang ``g`` (uid gu) Running across both trays, its domain ready, channel 3 in both CDI specs."""
    gang = {"metadata": {"namespace": NS, "name": "g", "uid": "gu"}, "status": {"phase": "Running"}}
    claims = [
        {
            "metadata": {
                "namespace": NS,
                "name": f"g-{i}",
                "uid": f"c{i}",
                "ownerReferences": [{"kind": "GpuGang", "name": "g", "uid": "gu"}],
            }
        }
        for i in range(2)
    ]
    pods = [
        {
            "metadata": {"namespace": NS, "name": f"g-pod-{i}", "labels": {imex_gangs.GANG_LABEL: "g"}},
            "spec": {"nodeName": TRAYS[i], "resourceClaims": [{"name": "x", "resourceClaimName": f"g-{i}"}]},
            "status": {"phase": "Running"},
        }
        for i in range(2)
    ]
    domain = {
        "metadata": {"name": "imex-gu", "generation": 2},
        "spec": {
            "clique": "clique-a",
            "nodes": list(TRAYS),
            "gangs": [
                {
                    "namespace": NS,
                    "name": "g",
                    "uid": "gu",
                    "channel": 3,
                    "claims": [{"namespace": NS, "name": f"g-{i}", "uid": f"c{i}", "node": TRAYS[i]} for i in range(2)],
                }
            ],
        },
        "status": {"nodes": [{"node": t, "ready": True, "observedGeneration": 2} for t in TRAYS]},
    }
    trays = [chaos_imex.TrayView(t, {f"c{i}": (f"{CH}3",)}, 1, True) for i, t in enumerate(TRAYS)]
    return {"gangs": [gang], "domains": [domain], "pods": pods, "claims": claims, "trays": trays}


def verdict(r: dict[str, Any]) -> Verdict:
    v = Verdict()
    view = chaos_imex.ImexApi(gangs=r["gangs"], domains=r["domains"])
    chaos_imex.check(v, view, r["pods"], r["claims"], r["trays"])
    return v


def test_a_consistent_reading_passes_every_check() -> None:
    v = verdict(reading())
    assert v.violations == [] and v.checks >= 15


def _tray(r: dict[str, Any], i: int, **change: Any) -> None:
    t = r["trays"][i]
    r["trays"][i] = chaos_imex.TrayView(
        t.name, change.get("channels", t.channels), change.get("daemons", t.daemons), change.get("dir", t.daemon_dir)
    )


def _gang_deleting(r: dict[str, Any]) -> None:
    r["gangs"][0]["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"


def _no_domain(r: dict[str, Any]) -> None:
    r["domains"] = []


CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "domain names a gang being deleted": (_gang_deleting, "which is gone or being deleted"),
    "domain names a claim that is gone": (lambda r: r["claims"].pop(1), "names claim chaos/g-1 (c1), which is gone"),
    "domain not ready on a node": (
        lambda r: r["domains"][0]["status"]["nodes"][1].update(ready=False),
        "is not ready on gb200-1",
    ),
    "domain status for an older generation": (
        lambda r: r["domains"][0]["metadata"].update(generation=3),
        "for generation 3",
    ),
    "member without a channel in its CDI spec": (
        lambda r: _tray(r, 0, channels={"c0": ()}),
        "carries [], want ['/dev/nvidia-caps-imex-channels/channel3']",
    ),
    "member with another gang's channel": (
        lambda r: _tray(r, 1, channels={"c1": (f"{CH}4",)}),
        "its CDI spec on gb200-1 carries ['/dev/nvidia-caps-imex-channels/channel4']",
    ),
    "a channel in a spec no domain names": (
        lambda r: _tray(r, 0, channels={"c0": (f"{CH}3",), "stray": (f"{CH}5",)}),
        "CDI spec of claim stray carries",
    ),
    "running members in no domain": (_no_domain, "is in no IMEX entry of its gang"),
    "a daemon on a tray no domain lists": (
        lambda r: (_no_domain(r), r["trays"].pop()),
        "1 IMEX daemons (in a domain: False)",
    ),
    "a daemon directory left": (
        lambda r: (
            _no_domain(r),
            r["pods"].clear(),
            _tray(r, 0, channels={}, daemons=0),
            _tray(r, 1, channels={}, daemons=0),
        ),
        "an IMEX daemon directory with no domain listing it",
    ),
    "no daemon on a tray of a domain": (
        lambda r: _tray(r, 1, daemons=0),
        "gb200-1: 0 IMEX daemons (in a domain: True)",
    ),
    "a claim outlives its gang": (
        lambda r: r["claims"][0]["metadata"]["ownerReferences"][0].update(uid="older"),
        "claim chaos/g-0 outlives its gang g",
    ),
    "a live gang not Running": (
        lambda r: r["gangs"][0]["status"].update(phase="Preempted"),
        "is Preempted, not Running",
    ),
    "a domain that does not parse": (
        lambda r: r["domains"][0]["spec"]["gangs"][0].update(channel=0),
        "ImexDomain imex-gu does not parse",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_violation_is_found(case: str) -> None:
    r = copy.deepcopy(reading())
    change, expected = CASES[case]
    change(r)
    found = verdict(r).violations
    assert any(expected in f for f in found), found


def test_stuck_names_gangs_being_deleted_and_live_member_only_their_pods() -> None:
    r = reading()
    view = chaos_imex.ImexApi(gangs=r["gangs"], domains=[])
    assert chaos_imex.stuck(view) == [] and chaos_imex.live_member(view)(r["pods"][0])
    _gang_deleting(r)
    assert chaos_imex.stuck(view) == ["GpuGang chaos/g (deleted at 2026-12-06T00:00:00Z)"]
    assert not chaos_imex.live_member(view)(r["pods"][0])


def test_read_tray_reads_channels_daemons_and_the_directory(tmp_path: Path) -> None:
    node = SimNode("gb200-0", "gb200-nvl72", 0, tmp_path / "n", tmp_path / "s", "127.0.0.1", 0)
    node.cdi_root.mkdir(parents=True)
    prefix = f"{names.CDI_VENDOR}-{names.CDI_CLASS}_"
    edits = {"deviceNodes": [{"path": f"{CH}7"}, {"path": "/dev/nvidia0"}]}
    (node.cdi_root / f"{prefix}c0.json").write_text(json.dumps({"containerEdits": edits}))
    (node.cdi_root / f"{prefix}c1.json").write_text(json.dumps({"containerEdits": {}}))
    proc = tmp_path / "proc"
    for pid, cmd in (("12", f"nvidia-imex\0-c\0{node.plugin_dir / 'imex' / 'config.cfg'}\0"), ("13", "sleep\0")):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(cmd.encode())
    view = chaos_imex.read_tray(node, proc)
    assert view == chaos_imex.TrayView("gb200-0", {"c0": (f"{CH}7",), "c1": ()}, 1, False)
    (node.plugin_dir / "imex").mkdir(parents=True)
    assert chaos_imex.read_tray(node, proc).daemon_dir
