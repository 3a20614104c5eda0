"""The gang sequences :mod:`bench.gangs.gang_domains` plays, and the objects one gang is written as in each API.

* ``SCENARIOS``: named sequences of gangs arriving and leaving, ``(action, gang, members, GPUs per member)``;
* :func:`claim_template`: the ResourceClaimTemplate of ``n`` GPUs in one NVLink domain every pod uses;
* :func:`gang_objects`: one gang as a Workload and a PodGroup (upstream), a GpuGang (gpuplane), or both
  (steered), and its pods. Pure.
"""

from __future__ import annotations

from typing import Any

from e2e.cluster import releases
from gpuplane.controller import names

Steps = tuple[tuple[str, str, int, int], ...]
# (action, gang, members, GPUs per member); "leave" removes the gang.
SCENARIOS: dict[str, Steps] = {
    # Mixed shapes arriving and one leaving, on all four domains.
    "mixed": (
        ("arrive", "a", 1, 4),
        ("arrive", "b", 2, 2),
        ("arrive", "c", 1, 2),
        ("arrive", "d", 2, 4),
        ("arrive", "e", 1, 4),
        ("leave", "b", 0, 0),
        ("arrive", "f", 2, 4),
        ("arrive", "g", 1, 8),
        ("arrive", "h", 2, 2),
        ("arrive", "i", 1, 4),
    ),
    # The HGX boards taken first, then small multi-node gangs on the GB200 racks: where inside a
    # domain the members go decides whether a later one-tray gang still fits.
    "trays": (
        ("arrive", "a", 1, 8),
        ("arrive", "b", 1, 8),
        ("arrive", "c", 2, 2),
        ("arrive", "d", 1, 4),
        ("arrive", "e", 1, 4),
        ("arrive", "f", 1, 4),
        ("arrive", "g", 1, 4),
    ),
}


def claim_template(ns: str, gpus: int) -> dict[str, Any]:
    """The ResourceClaimTemplate ``gpus-<n>``: ``gpus`` GPUs of gpuplane's class in one NVLink domain."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"gpus-{gpus}", "namespace": ns},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": "gpu.gpuplane.dev",
                                "allocationMode": "ExactCount",
                                "count": gpus,
                            },
                        }
                    ],
                    "constraints": [{"requests": ["gpus"], "matchAttribute": names.MATCH_ATTRIBUTE_DOMAIN}],
                }
            }
        },
    }


def _pod(ns: str, gang: str, index: int, gpus: int, api: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{gang}-{index}", "namespace": ns, "labels": {"bench/gang": gang}}
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": f"gpus-{gpus}"}],
        "containers": [
            {
                "name": "rank",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "requests": {"cpu": str(gpus), "memory": f"{16 * gpus}Gi"},
                    "claims": [{"name": "gpus"}],
                },
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if api in ("upstream", "steered"):
        spec["schedulingGroup"] = {"podGroupName": gang}
    if api in ("gpuplane", "steered"):
        meta["labels"].update({names.LABEL_GANG: gang, names.LABEL_MEMBER_INDEX: str(index)})
        spec["schedulingGates"] = [{"name": names.SCHEDULING_GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def template_ref(workload: str, template: str, api: str | None = None) -> dict[str, Any]:
    """A PodGroup's reference to its Workload's template, as ``api`` (default: the running release's) spells it:
    ``workloadRef`` at scheduling.k8s.io/v1beta1 (1.37), ``podGroupTemplateRef`` at v1alpha2 (1.36)."""
    if (api or releases.RUNNING.workload_api).endswith("/v1alpha2"):
        return {"podGroupTemplateRef": {"workload": {"workloadName": workload, "podGroupTemplateName": template}}}
    return {"workloadRef": {"workloadName": workload, "templateName": template}}


def gang_objects(ns: str, gang: str, members: int, gpus: int, api: str) -> list[dict[str, Any]]:
    """The objects one gang is written as, in ``api``: "upstream", "gpuplane", or "steered" (both)."""
    out: list[dict[str, Any]] = []
    if api in ("upstream", "steered"):
        policy = {"gang": {"minCount": members}}
        constraints = {"topology": [{"key": names.NODE_LABEL_NVLINK_DOMAIN}]}
        out.append(
            {
                "apiVersion": releases.RUNNING.workload_api,
                "kind": "Workload",
                "metadata": {"name": gang, "namespace": ns},
                "spec": {
                    "podGroupTemplates": [
                        {"name": "workers", "schedulingPolicy": policy, "schedulingConstraints": constraints}
                    ]
                },
            }
        )
        out.append(
            {
                "apiVersion": releases.RUNNING.workload_api,
                "kind": "PodGroup",
                "metadata": {"name": gang, "namespace": ns},
                "spec": {
                    **template_ref(gang, "workers"),
                    "schedulingPolicy": policy,
                    "schedulingConstraints": constraints,
                },
            }
        )
    if api in ("gpuplane", "steered"):
        out.append(
            {
                "apiVersion": names.GANG_API_VERSION,
                "kind": names.GANG_KIND,
                "metadata": {"name": gang, "namespace": ns},
                "spec": {"members": members, "gpusPerMember": gpus, "tensorParallelSize": members * gpus},
            }
        )
    out += [_pod(ns, gang, i, gpus, api) for i in range(members)]
    return out
