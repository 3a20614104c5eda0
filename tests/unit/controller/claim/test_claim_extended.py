"""The scheduler's claim behind ``nvidia.com/gpu`` (KEP-5004) as the claim checks see it."""

from __future__ import annotations

from typing import Any

from gpuplane.controller import deviceclass
from gpuplane.controller.claim import checks
from tests.controllerkit import GPU_CLASS


def claim(annotations: dict[str, str]) -> dict[str, Any]:
    request = {"name": "container-0-request-0", "exactly": {"deviceClassName": "gpu.gpuplane.dev", "count": 2}}
    return {
        "metadata": {"name": "p-extended-resources-x", "namespace": "n", "annotations": annotations},
        "spec": {"devices": {"requests": [request]}},
    }


def test_a_user_claim_for_two_gpus_without_a_constraint_is_warned() -> None:
    warning = checks.domain_warning(claim({}), {"gpu.gpuplane.dev": deviceclass.view(GPU_CLASS)})
    assert warning is not None and "matchAttribute" in warning


def test_the_schedulers_extended_resource_claim_is_not_warned() -> None:
    special = claim({checks.EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"})
    assert checks.domain_warning(special, {"gpu.gpuplane.dev": deviceclass.view(GPU_CLASS)}) is None
