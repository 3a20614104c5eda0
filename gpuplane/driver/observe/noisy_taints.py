"""Active noisy-neighbour alerts as device taints in the node's ResourceSlices (the controller's signal).

:class:`NoisyTaints` turns the detector's active alerts into one informational (``None``) taint
per GPU, :data:`gpuplane.api.noisy_taint.KEY`, whose value names the hog's claim and the
figures that raised the alert and whose ``timeAdded`` is when it was raised; the publisher merges
these with the health taints. The figures are those at the moment the alert was raised (the
share moves every tick; a value that changed every tick would rewrite the slice every tick).
:meth:`refresh` is called from the driver's main loop and says whether the taints changed, so
the loop republishes at once; the controller (``gpuplane.controller.rebalance``) reads them.
Pure apart from the clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from gpuplane.api import kubetime, noisy_taint
from gpuplane.driver.observe import noisy
from gpuplane.driver.publish.slices import DeviceTaint


class NoisyTaints:
    """The current noisy-neighbour taints, by GPU device name."""

    def __init__(self, active: Callable[[], Sequence[noisy.Alert]], settings: noisy.NoisySettings) -> None:
        self._active = active
        self._settings = settings
        self._lock = threading.Lock()
        self._taints: dict[str, DeviceTaint] = {}
        self._raised: dict[tuple[str, str], tuple[int, float]] = {}  # (gpu, hog) -> (share %, raised at)

    def refresh(self) -> bool:
        """Re-read the active alerts; True when the taints changed."""
        alerts = sorted(self._active(), key=lambda a: (a.gpu, a.since, a.hog.claim_uid))
        s = self._settings
        want: dict[str, DeviceTaint] = {}
        raised: dict[tuple[str, str], tuple[int, float]] = {}
        for a in alerts:
            key = (a.gpu, a.hog.claim_uid)
            share, at = self._raised.get(key) or (round(100 * min(1.0, a.share)), a.since + s.sustain_s)
            raised[key] = (share, at)
            if a.gpu in want:
                continue  # one taint per GPU: the alert raised first
            figures = noisy_taint.NoisyFigures(
                a.hog.claim_uid, share, round(100 * s.threshold), min(999_999, round(s.sustain_s))
            )
            want[a.gpu] = DeviceTaint(
                noisy_taint.KEY, noisy_taint.encode(figures), noisy_taint.EFFECT, kubetime.rfc3339(at)
            )
        with self._lock:
            changed = want != self._taints
            self._taints = want
            self._raised = raised
        return changed

    def taints(self) -> Mapping[str, Sequence[DeviceTaint]]:
        """Device name -> its noisy-neighbour taint (for the publisher)."""
        with self._lock:
            return {gpu: [t] for gpu, t in self._taints.items()}


def merged(*sources: Callable[[], Mapping[str, Sequence[DeviceTaint]]]) -> Callable[[], dict[str, list[DeviceTaint]]]:
    """One taint source from several (health, noisy neighbours), device by device."""

    def taints() -> dict[str, list[DeviceTaint]]:
        out: dict[str, list[DeviceTaint]] = {}
        for source in sources:
            for device, ts in source().items():
                out.setdefault(device, []).extend(ts)
        return out

    return taints
