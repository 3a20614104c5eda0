"""The e2e cluster's simulated GB200 trays run their IMEX daemons (the stand-ins), on one peer port per cluster.

``e2e.plane.simnode_plan.plan_nodes`` gives every tray of a cluster the same ``imex_port`` (chosen free at plan
time, kept in ``nodes.json``, reused for trays added later) and other nodes none; ``simnodes.driver_argv`` turns
it into ``--imex-daemons=process`` with the stand-ins of ``tests/fakes``, and ``driver_env`` gives the tray's
driver (and so its daemons) the stand-in's control directory.
"""

from __future__ import annotations

from pathlib import Path

from e2e.plane import nodes, simnode_plan, simnodes


def test_trays_share_one_imex_port_and_run_the_stand_ins(tmp_path: Path) -> None:
    planned = simnode_plan.plan_nodes(tmp_path, nodes.parse_node_spec("hgx-h100:1,gb200-nvl72:2"))
    hgx, tray0, tray1 = planned
    assert hgx.imex_port == 0 and tray0.imex_port == tray1.imex_port > 0
    assert simnode_plan.SimNode.from_json(tray0.to_json()) == tray0  # kept in nodes.json

    more = simnode_plan.plan_nodes(tmp_path, nodes.parse_node_spec("gb200-nvl72:1"), existing=planned)
    assert more[0].imex_port == tray0.imex_port  # a tray added later joins the cluster's port

    argv = simnodes.driver_argv(tray0, tmp_path / "kubeconfig")
    assert "--imex-daemons=process" in argv and f"--imex-port={tray0.imex_port}" in argv
    assert f"--imex-binary={simnodes.IMEX_STANDIN}" in argv and f"--imex-ctl-binary={simnodes.IMEX_CTL_STANDIN}" in argv
    assert simnodes.IMEX_STANDIN.is_file() and simnodes.IMEX_CTL_STANDIN.is_file()
    env = simnodes.driver_env(tray0)
    assert env is not None and env[simnodes.IMEX_CONTROL_ENV] == str(tray0.imex_control_dir)

    assert not [a for a in simnodes.driver_argv(hgx, tmp_path / "kubeconfig") if a.startswith("--imex")]
    assert simnodes.driver_env(hgx) is None
