"""The chaos e2e's workload: pods with whole-GPU, MIG and MPS claims, created and deleted in a loop.

:func:`templates` are the ResourceClaimTemplates the pods use (kube-controller-manager makes
each pod's claim from its template and deletes it with the pod, as for any DRA workload):

* ``whole``: one H100 of ``gpu.gpuplane.dev`` (the GB200 trays are left to :mod:`e2e.plane.chaos_imex`'s gangs);
* ``mig``: one ``1g.10gb`` MIG device of ``mig.gpuplane.dev`` (the driver creates the instance
  at prepare and destroys it at unprepare);
* ``mps``: a 20 % share of an H100 in the ``mps-bronze`` tier (a per-claim MPS control daemon);
* ``unfit``: nine GPUs on one node, which no node has: the claim stays pending and the
  controller must say why.

:class:`Churn` is a thread that, every ``interval`` seconds, deletes the oldest pod when
``live`` pods exist (a graceful and an immediate delete in turn) and creates the next one (kinds
in turn), until :meth:`Churn.finish` is called and at least ``total`` pods were created. It runs
through component crashes: a call that fails (the apiserver is down) is counted and tried again on
the next tick, and the pods it works on are read back from the API each time, so a create whose
answer was lost is not lost to the loop.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

from kubernetes import client

KIND_LABEL = "chaos.gpuplane.dev/kind"
MIG_PROFILE = "1g.10gb"
KINDS = ("whole", "mig", "mps")
UNFIT = "unfit"
_ATTR = 'device.attributes["gpu.gpuplane.dev"]'
H100 = f'{_ATTR}.productName.startsWith("NVIDIA H100")'  # the GB200 trays are the IMEX gangs' (chaos_imex)


def _request(class_name: str, *, count: int = 1, selector: str | None = None, share: int | None = None) -> Any:
    exactly: dict[str, Any] = {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if share is not None:
        exactly["capacity"] = {"requests": {"sharePercent": str(share)}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def templates(namespace: str) -> list[dict[str, Any]]:
    """One ResourceClaimTemplate per kind of pod (``chaos-<kind>``)."""
    specs = {
        "whole": _request("gpu.gpuplane.dev", selector=H100),
        "mig": _request("mig.gpuplane.dev", selector=f'{_ATTR}.migProfile == "{MIG_PROFILE}"'),
        "mps": _request("mps-bronze.gpu.gpuplane.dev", selector=H100, share=20),
        UNFIT: _request("gpu.gpuplane.dev", count=9),
    }
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"chaos-{kind}", "namespace": namespace},
            "spec": {"spec": spec},
        }
        for kind, spec in specs.items()
    ]


def pod(name: str, kind: str) -> dict[str, Any]:
    """A pause pod whose claim ``gpu`` is made from the template of ``kind``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {KIND_LABEL: kind}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"chaos-{kind}"}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


@dataclasses.dataclass
class ChurnCounts:
    """What the loop did."""

    created: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    deleted: dict[str, int] = dataclasses.field(default_factory=lambda: {"graceful": 0, "immediate": 0})
    failed_calls: int = 0
    ticks: int = 0

    @property
    def total_created(self) -> int:
        """Pods the API acknowledged creating."""
        return sum(self.created.values())


class Churn(threading.Thread):
    """Create and delete pods of ``kinds`` in ``namespace`` until finished (see the module docstring)."""

    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        *,
        kinds: Sequence[str] = KINDS,
        live: int = 6,
        total: int = 24,
        interval: float = 2.0,
        out: Callable[[str], None] = print,
    ) -> None:
        super().__init__(name="chaos-churn", daemon=True)
        self.core = core
        self.namespace = namespace
        self.kinds = tuple(kinds)
        self.live = live
        self.total = total
        self.interval = interval
        self.counts = ChurnCounts(created=dict.fromkeys(self.kinds, 0))
        self._out = out
        self._finish = threading.Event()
        self._abort = threading.Event()
        self._errors: list[str] = []

    def finish(self, timeout: float = 300.0) -> ChurnCounts:
        """Stop once ``total`` pods were created; wait for the thread and return the counts."""
        self._finish.set()
        self.join(timeout)
        if self.is_alive():
            self._abort.set()
            self.join(30)
            raise RuntimeError(f"churn did not reach {self.total} pods in {timeout:.0f}s: {self.counts}")
        return self.counts

    def abort(self) -> None:
        """Stop now (test teardown)."""
        self._abort.set()
        self.join(30)

    @property
    def last_errors(self) -> list[str]:
        """The last few failed calls (for the report)."""
        return self._errors[-5:]

    def run(self) -> None:
        n = 0
        while not self._abort.is_set():
            if self._finish.is_set() and self.counts.total_created >= self.total:
                return
            self.counts.ticks += 1
            try:
                self._delete_oldest()
                kind = self.kinds[n % len(self.kinds)]
                self.core.create_namespaced_pod(self.namespace, cast(Any, pod(f"chaos-{kind}-{n:03d}", kind)))
                self.counts.created[kind] += 1
                n += 1
            except Exception as err:  # the apiserver may be down: count it, try again on the next tick
                self.counts.failed_calls += 1
                self._errors.append(f"{type(err).__name__}: {str(err)[:160]}")
                n += 1  # a create whose answer was lost may have succeeded: never reuse its name
            self._abort.wait(self.interval)

    def _delete_oldest(self) -> None:
        listed = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{KIND_LABEL} in ({','.join(self.kinds)})"
        )
        metas = [p.metadata for p in listed.items if p.metadata is not None and p.metadata.name]
        alive = sorted(
            (m for m in metas if m.deletion_timestamp is None), key=lambda m: (m.creation_timestamp, str(m.name))
        )
        if len(alive) >= self.live:
            # In turn: a graceful delete (the kubelet stand-in unprepares, then removes the pod) and an
            # immediate one (grace 0: the pod is gone from the API at once, its claim soon after, and the
            # node unprepares from what it remembers, racing kube-controller-manager's claim deletion).
            how = "graceful" if sum(self.counts.deleted.values()) % 2 == 0 else "immediate"
            grace = 1 if how == "graceful" else 0
            self.core.delete_namespaced_pod(str(alive[0].name), self.namespace, grace_period_seconds=grace)
            self.counts.deleted[how] += 1
