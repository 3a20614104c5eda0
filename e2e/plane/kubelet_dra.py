"""DRA for one pod on the node: its claims, NodePrepareResources and NodeUnprepareResources, the CDI check.

What kubelet's DRA manager does: the claim names of the pod (``resourceClaimName``, or for a
template the name kube-controller-manager wrote to ``status.resourceClaimStatuses``); each claim
must be allocated and reserved for the pod (:class:`PodNotReady` until then); claims are prepared
per driver through the registered plugins, and every returned CDI id must resolve to a spec file
under the node's CDI root (what the container runtime would check), else :class:`PrepareFailed`.
As kubelet's claim info cache: a claim already prepared on the node (shared with a running pod) is
not prepared again, until it has been unprepared.
Unprepare retries with backoff until every driver answered. Side effects: reads claims, calls
the plugins (which change the node), Events through the caller on failures.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.plane.kubelet_plugins import PluginRegistry
from e2e.plane.kubelet_pods import PodView
from gpuplane.api import boundedjson
from gpuplane.driver.prepare import cdi
from gpuplane.driver.prepare.contract import ClaimRef, PrepareResult

_log = logging.getLogger("e2e.plane.kubelet")

GROUP, VERSION = "resource.k8s.io", "v1"
BACKOFF_INITIAL_S = 1.0


class PodNotReady(Exception):
    """The pod cannot start yet for a reason that is expected to pass (claim not allocated yet, plugin missing)."""


class PrepareFailed(Exception):
    """NodePrepareResources failed for a claim, or its CDI ids do not resolve: reported as an Event."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim of a pod, and the drivers that allocated its devices."""

    ref: ClaimRef
    drivers: frozenset[str]


class PodDra:
    """Claims of pods on one node, prepared and unprepared through the registered plugins."""

    def __init__(
        self, custom: client.CustomObjectsApi, plugins: PluginRegistry, node_name: str, cdi_root: Path
    ) -> None:
        self.custom = custom
        self.plugins = plugins
        self.node_name = node_name
        self.cdi_root = cdi_root
        self._lock = threading.Lock()
        self._ready: set[str] = set()  # uids of claims NodePrepareResources succeeded for (kubelet's cache)

    @staticmethod
    def claim_names(pod: PodView) -> list[str]:
        """Claim names of the pod's ``spec.resourceClaims``, template ones from the pod status."""
        out = []
        for entry, claim_name, template in pod.claims:
            if claim_name:
                out.append(claim_name)
            elif template:
                if entry not in pod.generated:
                    raise PodNotReady(f"claim for {entry!r} (template) not created yet")
                generated = pod.generated[entry]
                if generated:  # None: the template yields no claim for this pod
                    out.append(generated)
        if pod.extended_claim:  # KEP-5004: e.g. limits nvidia.com/gpu served by a DeviceClass's extendedResourceName
            out.append(pod.extended_claim)
        return out

    def claims_of(self, pod: PodView) -> list[Claim]:
        namespace = pod.namespace
        claims = []
        for claim_name in self.claim_names(pod):
            try:
                raw: Any = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", claim_name, _preload_content=False
                )
                # kubelet (Go) reads claims of any depth; what it needs (metadata, status) is shallow.
                obj = cast(dict[str, Any], boundedjson.decode(raw.data, boundedjson.MAX_OBJECT_DEPTH).value)
            except ApiException as err:
                # 403 while the Node authorizer's graph has not seen the binding yet; 404 before creation.
                if err.status in (403, 404):
                    raise PodNotReady(f"claim {claim_name}: {err.status} {err.reason}") from err
                raise
            status = obj.get("status") or {}
            allocation = status.get("allocation")
            if not allocation:
                raise PodNotReady(f"claim {claim_name} is not allocated yet")
            reserved = {r.get("uid") for r in status.get("reservedFor") or []}
            if pod.uid not in reserved:
                raise PodNotReady(f"claim {claim_name} is not reserved for the pod yet")
            results = (allocation.get("devices") or {}).get("results") or []
            drivers = frozenset(str(r["driver"]) for r in results)
            meta = obj["metadata"]
            claims.append(Claim(ClaimRef(namespace=namespace, uid=meta["uid"], name=meta["name"]), drivers))
        return claims

    def prepare(self, claims: Sequence[Claim]) -> None:
        """NodePrepareResources for ``claims`` not prepared on the node yet, per driver; PrepareFailed on failure."""
        with self._lock:
            todo = [claim for claim in claims if claim.ref.uid not in self._ready]
        by_driver: dict[str, list[ClaimRef]] = {}
        for claim in todo:
            for driver in claim.drivers:
                by_driver.setdefault(driver, []).append(claim.ref)
        for driver, refs in sorted(by_driver.items()):
            plugin = self.plugins.get(driver)
            if plugin is None:
                raise PrepareFailed(f"DRA driver {driver} is not registered on node {self.node_name}")
            try:
                results = plugin.prepare(refs)
            except Exception as err:
                raise PrepareFailed(f"NodePrepareResources with driver {driver} failed: {err}") from err
            for ref in refs:
                result = results.get(ref.uid)
                if result is None:
                    raise PrepareFailed(f"driver {driver} returned no result for claim {ref.name}")
                if result.error:
                    raise PrepareFailed(f"claim {ref.name}: {result.error}")
                self._check_cdi(ref, result)
                with self._lock:
                    self._ready.add(ref.uid)

    def _check_cdi(self, ref: ClaimRef, result: PrepareResult) -> None:
        for device in result.devices:
            if not device.cdi_device_ids:
                raise PrepareFailed(f"claim {ref.name}: device {device.device_name} has no CDI ids")
            for cdi_id in device.cdi_device_ids:
                if cdi.resolve(self.cdi_root, cdi_id) is None:
                    raise PrepareFailed(f"claim {ref.name}: CDI device {cdi_id} has no spec in {self.cdi_root}")

    def unprepare(
        self,
        pod: PodView,
        claims: Sequence[Claim],
        *,
        stop: threading.Event,
        warn: Callable[[PodView, str, str], None],
        backoff_max_s: float,
    ) -> None:
        """NodeUnprepareResources for ``claims`` until every driver answered (or ``stop``); failures are Events."""
        delay = BACKOFF_INITIAL_S
        pending = {(driver, claim.ref) for claim in claims for driver in claim.drivers}
        while pending and not stop.is_set():
            errors: list[str] = []
            for driver in sorted({d for d, _ in pending}):
                refs = sorted((r for d, r in pending if d == driver), key=lambda r: r.uid)
                plugin = self.plugins.get(driver)
                if plugin is None:
                    errors.append(f"DRA driver {driver} is not registered")
                    continue
                try:
                    results = plugin.unprepare(refs)
                except Exception as err:
                    errors.append(f"NodeUnprepareResources with {driver} failed: {err}")
                    continue
                for ref in refs:
                    result = results.get(ref.uid)
                    if result is not None and not result.error:
                        pending.discard((driver, ref))
                        with self._lock:
                            self._ready.discard(ref.uid)
                    else:
                        errors.append(f"claim {ref.name}: {result.error if result else 'no result'}")
            if not pending:
                return
            _log.warning("unprepare for pod %s failed, retrying: %s", pod.key, "; ".join(errors))
            warn(pod, "FailedUnprepareDynamicResources", "; ".join(errors))
            stop.wait(delay)
            delay = min(delay * 2, backoff_max_s)
