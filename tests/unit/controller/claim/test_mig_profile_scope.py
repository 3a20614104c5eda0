"""A MIG profile is a GPU model's own: gangs and claim explanations count only GPUs publishing it (issue 18, defect 2).

The cluster is the real driver's slices for two HGX H100 nodes (``1g.10gb``, ...) and four GB200
trays (``1g.23gb``, ...). Both geometries have a ``1g`` slot, so a placement that counts geometry
slots alone puts an H100 profile on a GB200 GPU, where its claims can never allocate: the gang sat
at Placed / GatesLifted forever, and 88 pending ``1g.10gb`` claims were explained with nothing.
Here every H100 GPU is held whole, so no ``1g.10gb`` fits anywhere, though GB200 has room.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.controller import indexed
from gpuplane.controller.node import snapshot_builder
from tests import controllerkit as kit

H100_1G = "1g.10gb"


@pytest.fixture(scope="module", name="slices")
def slices_fixture(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return kit.cluster_slices(tmp_path_factory.mktemp("sim"))


def _hgx_held(slices: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A whole-GPU gang holding every GPU of both HGX H100 nodes (its claims allocated)."""
    view = snapshot_builder.build_view(slices)
    hgx = sorted({g.node for g in view.gpus if g.node.startswith("hgx-")})
    gpus = sum(1 for g in view.gpus if g.node == hgx[0])
    return kit.holding("big", "team-b", 0, hgx, kit.T0, gpus=gpus)


def test_the_view_knows_which_gpus_publish_a_profile(slices: list[dict[str, Any]]) -> None:
    view = snapshot_builder.build_view(slices)
    snap = view.snapshot(None, mig_profile=H100_1G)
    nodes = {n.name for d in snap.domains for n in d.nodes}
    assert nodes == {"hgx-0", "hgx-1"}
    assert {n.name for d in view.snapshot(None, mig_profile="1g.23gb").domains for n in d.nodes} == {
        f"nvl-{i}" for i in range(4)
    }


def test_a_mig_gang_is_placed_only_on_gpus_that_publish_its_profile(slices: list[dict[str, Any]]) -> None:
    big, big_pods, big_claims = _hgx_held(slices)
    gang = kit.gang_body("mig", members=2, migProfile=H100_1G)
    pods = [kit.member_pod("mig", i) for i in range(2)]
    w = kit.make_world(slices, [big, gang], [*big_pods, *pods], big_claims)
    plan, _ = kit.run_pass(w)
    action = plan.actions["team-a/mig"]
    placed_on = [m.node for m in action.decision.members] if action.decision else []
    assert action.kind != "place", f"placed on {placed_on}: {H100_1G} is no profile of those GPUs"
    assert not any(n.startswith("nvl-") for n in placed_on)


def test_a_mig_gang_with_room_on_its_own_gpus_is_placed_there(slices: list[dict[str, Any]]) -> None:
    gang = kit.gang_body("mig", members=3, migProfile=H100_1G)
    w = kit.make_world(slices, [gang], [kit.member_pod("mig", i) for i in range(3)])
    plan, _ = kit.run_pass(w)
    action = plan.actions["team-a/mig"]
    assert action.kind == "place" and action.decision is not None
    assert {m.node for m in action.decision.members} <= {"hgx-0", "hgx-1"}


def test_a_pending_mig_claim_whose_profile_has_no_room_is_explained(slices: list[dict[str, Any]]) -> None:
    _, _, big_claims = _hgx_held(slices)
    view = snapshot_builder.build_view(slices, [indexed.claim(c) for c in big_claims])  # as the claim index holds them
    sel = f'device.attributes["gpu.gpuplane.dev"].migProfile == "{H100_1G}"'
    claim = kit.claim_body([kit.req("m", cls="mig.gpuplane.dev", sel=[sel])])
    why = kit.explain(claim, kit.CLASSES, view)
    assert f"no free placement for profile {H100_1G} (0 of 1 needed on GPUs that publish it)" in why, why
    assert "every such GPU is taken" in why, why
