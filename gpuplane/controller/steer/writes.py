"""What steering writes on a gated pod: the JSON patch for each action, and which actions a pass writes. Pure.

A steered pod gets its node in its affinity, the gate lifted and ``gpuplane.dev/steered``; a released pod
the gate lifted and ``gpuplane.dev/steer-result`` (why); a pod kept gated for the MIG offer only that
reason (written once: its patch also tells a pod that cannot be written from one that can, as every
other action's does, so a tenant's unwritable pods go behind the others before any room appears).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuplane.controller.indexed import PodView
from gpuplane.controller.steer import decide, gate

ANNOTATION_STEERED = "gpuplane.dev/steered"  # "node;domain;placement" of a steered, not yet bound pod
ANNOTATION_RESULT = "gpuplane.dev/steer-result"  # why the gate was lifted without a node, or is kept
MAX_WRITES = 64  # per pass, timeout releases aside: the rest are decided again by the next pass


def patch_for(pod: PodView, action: decide.Action, settings: decide.Settings) -> list[dict[str, Any]]:
    """The JSON patch for one action: steer (affinity + gate + annotation) or release (gate + annotation)."""
    had = pod.annotations  # None: the pod has no annotation map at all (the index says so)
    if action.kind == "wait":  # only why: the gate stays
        return gate.annotation_ops(had, {ANNOTATION_RESULT: f"{action.outcome}: {action.reason}"[:250]})
    if action.kind == "steer" and action.placement is not None:
        ops = gate.steer_patch(pod, action.placement.node, settings.mode, settings.gate)
        mine: dict[str, str | None] = {
            ANNOTATION_STEERED: decide.encode_placement(action.placement),
            ANNOTATION_RESULT: None,
        }
    else:
        ops = gate.release_patch(pod, settings.gate)
        mine = {ANNOTATION_RESULT: f"{action.outcome}: {action.reason}"[:250]}
    return [*ops, *gate.annotation_ops(had, mine)]


def writes_of(actions: Sequence[decide.Action], failures: Mapping[str, int]) -> list[decide.Action]:
    """The actions a pass writes: every timeout release, then the others, pods that failed before last.

    Timeout releases are never capped (the 30 s promise holds however many pods are gated); the rest
    are at most ``MAX_WRITES``, in the pass's order (oldest first) but behind it the pods whose patches
    failed, fewest failures first, so a pod that can never be written cannot take a slot from one
    that can.
    """
    acting = [a for a in actions if a.kind != "wait" or a.outcome == "mig-offer"]
    timeouts = [a for a in acting if a.outcome == "timeout"]
    rest = [a for a in acting if a.outcome != "timeout"]
    rest.sort(key=lambda a: failures.get(a.key, 0))  # stable: the pass's order among equals
    return [*timeouts, *rest[:MAX_WRITES]]
