"""The Kubernetes releases the harness runs, and which one it runs: the one place that names the version.

Each supported release has a Go module in ``e2e/cluster/k8sbuild/v<minor>/`` that pins
``k8s.io/kubernetes`` (and the etcd it ships with); the binaries are built from it
(:mod:`e2e.cluster.build`) and cached per release. What differs between releases beyond the
binaries is here: the feature gates and API versions the control plane and kubelets are started
with (a gate a release does not know, or an API version it does not serve, stops the component at
start-up, so each release lists its own), and the API versions gpuplane's objects use there.

``DEFAULT`` is the release ``e2e build/up/demo``, the real nodes, CI and the benchmarks run;
``GPUPLANE_KUBERNETES=1.36`` (read once, by :func:`selected`) picks another supported release for a
whole run, as CI's smoke subset does. Feature stages are from each module's
``pkg/features/kube_features.go`` and ``pkg/controlplane/instance.go``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

ENV = "GPUPLANE_KUBERNETES"
K8SBUILD = Path(__file__).resolve().parent / "k8sbuild"


@dataclasses.dataclass(frozen=True)
class Release:
    """One supported Kubernetes minor release: where it is pinned and how its components are started."""

    minor: str
    feature_gates: Mapping[str, bool]
    runtime_config: Mapping[str, bool]
    workload_api: str
    """The group/version of Workload and PodGroup this release serves (``scheduling.k8s.io/...``)."""
    device_taint_rule_api: str
    """The group/version gpuplane's DeviceTaintRules are written at on this release."""
    podgroup_scheduled: str = "PodGroupInitiallyScheduled"
    """The PodGroup condition the scheduler sets once a gang is placed (``PodGroupScheduled`` in v1alpha2)."""

    @property
    def module_dir(self) -> Path:
        """The Go module pinning this release (``e2e/cluster/k8sbuild/v<minor>``)."""
        return K8SBUILD / f"v{self.minor}"


V1_36 = Release(
    minor="1.36",
    feature_gates={
        # Beta and on by default in 1.36: set explicitly so that a renamed or removed gate makes
        # start-up fail loudly instead of silently changing behaviour.
        "DRADeviceTaints": True,
        "DRAPartitionableDevices": True,
        "DRAResourceClaimDeviceStatus": True,
        "DRADeviceBindingConditions": True,
        "DRAConsumableCapacity": True,
        "DRAExtendedResource": True,
        # Beta but off by default in 1.36: the DeviceTaintRule API (resource.k8s.io/v1beta2, off by default).
        "DRADeviceTaintRules": True,
        # Alpha in 1.35/1.36: the Workload and PodGroup API (scheduling.k8s.io/v1alpha2), the
        # scheduler's GangScheduling plugin, and topology constraints for pod groups.
        "GenericWorkload": True,
        "GangScheduling": True,
        "TopologyAwareWorkloadScheduling": True,
        # Beta and on by default in 1.36 (alpha 1.31-1.35): kubelet reports a DRA driver's device health
        # in pod status (allocatedResourcesStatus, KEP-4680); the apiserver drops the field when it is off.
        "ResourceHealthStatus": True,
    },
    runtime_config={
        "resource.k8s.io/v1beta1": True,
        "resource.k8s.io/v1beta2": True,  # DeviceTaintRule (beta)
        "resource.k8s.io/v1alpha3": True,  # DeviceTaintRule storage version, ResourcePoolStatusRequest
        "scheduling.k8s.io/v1alpha2": True,  # Workload, PodGroup
    },
    workload_api="scheduling.k8s.io/v1alpha2",
    device_taint_rule_api="resource.k8s.io/v1beta2",
    podgroup_scheduled="PodGroupScheduled",
)

V1_37 = Release(
    minor="1.37",
    feature_gates={
        # GA in 1.37 (DRADeviceTaints and DRADeviceTaintRules not yet locked; device status and extended
        # resources locked on): set explicitly so that a removed gate fails start-up loudly.
        "DRADeviceTaints": True,
        "DRADeviceTaintRules": True,
        "DRAExtendedResource": True,
        "DRAResourceClaimDeviceStatus": True,
        # Beta and on by default.
        "DRAPartitionableDevices": True,
        "DRADeviceBindingConditions": True,
        "DRAConsumableCapacity": True,
        "ResourceHealthStatus": True,
        # Beta but off by default in 1.37: the Workload and PodGroup API (scheduling.k8s.io/v1beta1) and
        # gang scheduling (the GangScheduling gate of 1.35/1.36 is gone: gangs come with GenericWorkload).
        "GenericWorkload": True,
        # Alpha: topology constraints for pod groups.
        "TopologyAwareWorkloadScheduling": True,
    },
    runtime_config={
        # DeviceTaintRule is served at resource.k8s.io/v1 (GA) by default; the older versions stay on
        # for clients (and stored objects) of 1.36.
        "resource.k8s.io/v1beta1": True,
        "resource.k8s.io/v1beta2": True,
        "scheduling.k8s.io/v1beta1": True,  # Workload, PodGroup (beta, off by default)
    },
    workload_api="scheduling.k8s.io/v1beta1",
    device_taint_rule_api="resource.k8s.io/v1",
)

V1_38_PROBE = Release(
    minor="1.38",
    feature_gates={
        # GA in 1.38.0-beta.0: DRADeviceTaints, DRADeviceTaintRules, DRAPartitionableDevices,
        # DRADeviceBindingConditions, DRAConsumableCapacity (and, since 1.37, DRAExtendedResource and
        # DRAResourceClaimDeviceStatus); most are locked on, so they are not set.
        "ResourceHealthStatus": True,  # still beta
        "GenericWorkload": True,  # beta, off by default
        "TopologyAwareWorkloadScheduling": True,  # beta, off by default
    },
    runtime_config={
        "resource.k8s.io/v1beta1": True,
        "resource.k8s.io/v1beta2": True,
        "scheduling.k8s.io/v1beta1": True,
    },
    workload_api="scheduling.k8s.io/v1beta1",
    device_taint_rule_api="resource.k8s.io/v1",
)
"""1.38.0-beta.0, for a probe only (``GPUPLANE_KUBERNETES=1.38``; needs Go 1.27: ``GOTOOLCHAIN=go1.27.1``)."""

RELEASES: Mapping[str, Release] = {r.minor: r for r in (V1_36, V1_37)}
PROBES: Mapping[str, Release] = {V1_38_PROBE.minor: V1_38_PROBE}
"""Releases the harness can run for a probe but CI does not test (docs/kubernetes-versions.md)."""
DEFAULT = "1.37"


class UnknownRelease(ValueError):
    """A requested Kubernetes release is not one the harness supports."""


def get(minor: str) -> Release:
    """The release ``minor`` (``"1.37"``, also ``"v1.37"`` or ``"1.37.2"``); UnknownRelease if unsupported."""
    wanted = ".".join(minor.strip().removeprefix("v").split(".")[:2])
    try:
        return {**PROBES, **RELEASES}[wanted]
    except KeyError:
        raise UnknownRelease(
            f"Kubernetes {minor!r} is not supported by the harness; {ENV} may name one of "
            f"{', '.join(sorted(RELEASES))} (default {DEFAULT}), or for a probe {', '.join(sorted(PROBES))}"
        ) from None


def selected(environ: Mapping[str, str]) -> Release:
    """The release ``$GPUPLANE_KUBERNETES`` names, else :data:`DEFAULT`."""
    return get(environ.get(ENV) or DEFAULT)


RUNNING: Release = selected(os.environ)
"""The release this process runs (``$GPUPLANE_KUBERNETES``, read once at import, else :data:`DEFAULT`)."""
