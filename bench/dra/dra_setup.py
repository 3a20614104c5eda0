"""The DRA-overhead benchmark's objects: its namespace, the ResourceClaimTemplate of each claim kind, the pods.

Pure: plain API dicts.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "dra-overhead"
PAUSE = "registry.k8s.io/pause:3.10"


def claim_template(kind: str) -> dict[str, Any]:
    """The ResourceClaimTemplate every claim pod uses."""
    if kind == "mig":
        exactly: dict[str, Any] = {
            "deviceClassName": "mig.gpuplane.dev",
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"'}}],
        }
    elif kind == "timeslice":
        exactly = {"deviceClassName": "gpu.gpuplane.dev", "capacity": {"requests": {"sharePercent": "50"}}}
    else:
        exactly = {"deviceClassName": "mps-bronze.gpu.gpuplane.dev", "capacity": {"requests": {"sharePercent": "50"}}}
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if kind == "timeslice":
        devices["config"] = [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {
                        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}},
                    },
                }
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": NAMESPACE},
        "spec": {"spec": {"devices": devices}},
    }


def pod(name: str, round_label: str, with_claim: bool) -> dict[str, Any]:
    """One benchmark pod."""
    container: dict[str, Any] = {"name": "c", "image": PAUSE}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if with_claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench-round": round_label}},
        "spec": spec,
    }
