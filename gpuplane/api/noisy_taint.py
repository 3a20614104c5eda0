"""The noisy-neighbour device taint: how the driver tells the controller, through its ResourceSlice.

While a noisy-neighbour alert is active on a GPU the node driver publishes, on that GPU's device,
a taint with effect ``None`` (informational: it changes no scheduling), key
:data:`KEY`, ``timeAdded`` = when the alert was raised, and a value that carries the figures:
``<hog claim uid>_<share %>_<threshold %>_<sustain s>`` (at most 63 characters, a label value).

Why a slice taint and not the driver's Events: a node's ResourceSlices can be written only by
that node's driver (the ValidatingAdmissionPolicy gpuplane-driver-own-node-slices), while anyone
who may create Events in a namespace could forge a NoisyNeighbour Event there and have a
neighbour's pod evicted. The controller still checks that the named claim is allocated on that
very device before it acts. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuplane.api import names

KEY = f"{names.DRIVER_NAME}/noisy-neighbour"
EFFECT = "None"
_VALUE = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})_(\d{1,3})_(\d{1,3})_(\d{1,6})$")


@dataclass(frozen=True)
class NoisyFigures:
    """What a noisy-neighbour taint says: the hog's claim and the figures that raised the alert."""

    hog_uid: str
    share_pct: int  # the hog's share of the GPU's memory bandwidth when the alert was raised
    threshold_pct: int
    sustain_s: int


def encode(f: NoisyFigures) -> str:
    """The taint value."""
    return f"{f.hog_uid}_{f.share_pct}_{f.threshold_pct}_{f.sustain_s}"


def decode(value: object) -> NoisyFigures | None:
    """The figures of a taint value, or None when it is not one this driver writes."""
    if not isinstance(value, str):
        return None
    m = _VALUE.match(value)
    if m is None:
        return None
    share, threshold, sustain = int(m.group(2)), int(m.group(3)), int(m.group(4))
    if share > 100 or threshold > 100:
        return None
    return NoisyFigures(m.group(1), share, threshold, sustain)
