"""Trace pods as needs, and the options each variant of the right-sizing replay offers them. Pure.

A fractional pod (``num_gpu == 1``, ``gpu_milli < 1000``) needs ``gpu_milli / 1000`` of one GPU:
that share of its SMs (``compute`` = ceil(milli / 10) %) and of its memory (the openb trace has no
GPU memory column; GPU-sharing in that cluster hands out memory with the share, so the need's
memory is ``milli / 1000`` of the GPU's). What it is offered is decided by gpuplane's own rule,
:func:`gpuplane.controller.rightsize.alternatives.plan`, on the fleet's one model, an H100 80GB
with the driver's MIG table (``gpuplane.mig.models.H100_80GB``, SMs and memory as the
driver publishes them):

* ``fixed``: the smallest MIG profile that meets the need, and nothing else (what a user who
  must name one profile picks at best); the pod waits until that profile fits.
* ``right-sized``: the GpuRequest's ``firstAvailable`` list: for a hard need the smallest MIG
  profile then a whole GPU; for a soft need the list of the rule (an MPS share of exactly the
  need before a MIG profile that would round it up, then the whole GPU).

Whole-GPU and multi-GPU pods are the same in every variant. The options' ``held`` is the
dominant share of one GPU the option holds (MIG: the larger of its memory and SM shares; MPS:
the need itself; whole GPU: 1); ``need`` is the pod's own share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpuplane.controller.rightsize import alternatives, fleet
from gpuplane.controller.rightsize.need import Need
from gpuplane.driver.hw import sim_profiles
from gpuplane.mig import models

Variant = Literal["fixed", "right-sized"]
GPU = sim_profiles.H100_SXM
MIG_TABLE = models.H100_80GB
# The placement module's Hopper geometry names, by (compute slices, memory slices).
PLACEMENT_PROFILE = {(1, 1): "1g", (1, 2): "1g.2m", (2, 2): "2g", (3, 4): "3g", (4, 4): "4g", (7, 8): "7g"}


@dataclass(frozen=True, slots=True)
class Option:
    """One way to hold a fractional pod: a MIG profile (placement name), an MPS share, or a whole GPU."""

    kind: Literal["MIG", "MPS", "GPU"]
    held: float
    profile: str | None = None  # placement geometry name ("2g", "1g.2m")
    share: int = 0  # MPS: percent of the GPU's SMs (and of its memory)

    def label(self) -> str:
        """Short label for tables."""
        return self.profile or (f"mps{self.share}" if self.kind == "MPS" else "gpu")


def h100() -> fleet.GpuModel:
    """The fleet's GPU model as the driver publishes it (MIG profiles without the +me variants)."""
    mig = tuple(
        sorted(
            fleet.MigOption(p.name, p.memory_bytes, p.multiprocessors)
            for p in MIG_TABLE.profiles
            if "+me" not in p.name
        )
    )
    return fleet.GpuModel(GPU.product_name, GPU.memory_bytes, GPU.multiprocessors, mig)


def need_of(milli: int, soft: bool, model: fleet.GpuModel) -> Need:
    """The need of a fractional pod of ``milli`` thousandths of a GPU."""
    return Need(
        memory_bytes=max(1, model.memory_bytes * milli // 1000),
        compute_percent=max(1, -(-milli // 10)),
        isolation="soft" if soft else "hard",
    )


def _placement_name(profile: str) -> str:
    p = MIG_TABLE.profile_by_name(profile)
    if p is None:
        raise KeyError(f"{profile} is not an H100 80GB profile")
    return PLACEMENT_PROFILE[(p.compute_slices, p.memory_slices)]


def options(milli: int, soft: bool, variant: Variant, model: fleet.GpuModel) -> tuple[Option, ...]:
    """What a fractional pod is offered, in order (see the module doc)."""
    plan = alternatives.plan(need_of(milli, soft, model), [model], {})
    out: list[Option] = []
    for alt in plan.alternatives:
        if alt.kind == "MIG" and alt.profile is not None:
            out.append(Option("MIG", alt.held, _placement_name(alt.profile)))
        elif alt.kind == "MPS" and alt.share_percent is not None:
            out.append(Option("MPS", alt.held, share=alt.share_percent))
        elif alt.kind == "GPU":
            out.append(Option("GPU", 1.0))
    if variant == "fixed":
        mig = [o for o in out if o.kind == "MIG"]
        return tuple(mig[:1]) or (Option("GPU", 1.0),)  # a need above 4g's SMs: only a whole GPU fits
    return tuple(out)


def soft_threshold(durations: Sequence[float], fraction: float) -> float:
    """Duration below which a fractional pod counts as soft (the shortest ``fraction`` of them)."""
    if fraction <= 0:
        return -1.0
    if fraction >= 1:
        return float("inf")
    ordered = sorted(durations)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
