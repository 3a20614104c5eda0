"""The create rule: may a GPU instance join the ones already on a GPU, and if not, what NVML answers.

:func:`check_create` validates the request the way NVML does (a profile constant the model has, a
start slot in the profile's placement list) and then applies the coexistence rule of
:mod:`gpuplane.mig.geometry`: the new instance's footprint must be disjoint from every existing
one's, and no profile may exceed its ``max_count``. The simulator raises the refusal as the
hardware error NVML would return; the placement module packs the same rule into its slot
arithmetic (:mod:`gpuplane.placement.geometry`). Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuplane.mig import geometry
from gpuplane.mig.models import MigModel, MigProfile


class RefusalCode(enum.Enum):
    """The NVML return code a refusal maps to (values as the driver's ``hw.ErrorCode``)."""

    NOT_SUPPORTED = "NotSupported"
    INVALID_ARGUMENT = "InvalidArgument"
    INSUFFICIENT_RESOURCES = "InsufficientResources"


@dataclass(frozen=True)
class Refusal:
    """Why a GI creation would be refused, with the NVML code it maps to."""

    code: RefusalCode
    reason: str


def footprint(model: MigModel, profile: MigProfile, start: int) -> int:
    """The slices ``profile`` at ``start`` takes on ``model`` (:func:`gpuplane.mig.geometry.footprint`)."""
    return geometry.footprint(model.layout, profile.compute_slices, profile.memory_slices, start)


def check_create(
    model: MigModel,
    existing: Iterable[tuple[int, int]],
    profile_id: int,
    placement_start: int,
) -> Refusal | None:
    """Decide whether a GI of ``profile_id`` at ``placement_start`` can join ``existing``.

    ``existing`` holds ``(profile_id, placement_start)`` of the GIs already on the GPU. Returns None
    when the creation is allowed, else the refusal NVML would give:
    NOT_SUPPORTED for a profile the model lacks, INVALID_ARGUMENT for a start slot not in the
    profile's placement list, INSUFFICIENT_RESOURCES for a taken/overlapping placement or an
    exceeded per-profile count. (Exhausted compute slices show as an overlap: the footprint holds
    the compute slices too.)
    """
    if not 0 <= profile_id < geometry.GI_PROFILE_COUNT:
        return Refusal(RefusalCode.INVALID_ARGUMENT, f"profile constant {profile_id} out of range")
    prof = model.profile(profile_id)
    if prof is None:
        return Refusal(RefusalCode.NOT_SUPPORTED, f"profile {profile_id} not supported on {model.key}")
    if placement_start not in prof.placements:
        return Refusal(
            RefusalCode.INVALID_ARGUMENT,
            f"placement {placement_start} not valid for {prof.name} (valid: {list(prof.placements)})",
        )
    mine = footprint(model, prof, placement_start)
    same = 0
    for other_pid, other_start in existing:
        other = model.profile(other_pid)
        if other is None:  # cannot happen for state this module accepted
            continue
        if other_pid == profile_id:
            same += 1
        if mine & footprint(model, other, other_start):
            return Refusal(
                RefusalCode.INSUFFICIENT_RESOURCES,
                f"{prof.name}@{placement_start} overlaps {other.name}@{other_start}",
            )
    if same >= prof.max_count:
        return Refusal(RefusalCode.INSUFFICIENT_RESOURCES, f"{prof.name}: at most {prof.max_count} instances")
    return None


def layout_is_valid(model: MigModel, instances: Sequence[tuple[int, int]]) -> bool:
    """True when every ``(profile_id, start)`` could have been created in this order (order-free rules)."""
    return all(check_create(model, instances[:i], pid, s) is None for i, (pid, s) in enumerate(instances))
