"""The controller's API writes as values: what a feature decides to write, executed by
:meth:`gpuplane.controller.kube.KubeWriter.run`.

A feature computes a list of :class:`Step` (a gang's placement or release, :mod:`.gang.writes`; a steered
pod's patch, :mod:`.steer.reconciler`) and hands it to the writer; the vocabulary lives here, below every
feature, so that the writer imports none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Step:
    """One idempotent API write. ``kind``: create-claim, delete-claim, patch-pod, delete-pod, evict-pod,
    suspend-job, suspend-jobset, wait. An evict-pod's ``body`` is an :class:`Eviction`."""

    kind: str
    name: str
    body: Any = None
    why: str = ""


@dataclass(frozen=True)
class Eviction:
    """An eviction through the Eviction API (PodDisruptionBudgets apply) of the pod with ``uid`` only;
    ``dry_run``: the API server checks it (the budgets included) and changes nothing."""

    uid: str
    grace_seconds: int | None = None
    dry_run: bool = False
