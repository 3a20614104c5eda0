"""The node driver's MPS daemon pods for the pod-policy tests (tests/e2e/test_rbac_writes.py): a pod body as
``--mps-daemons=pod`` makes it, and helpers that tell a refusal by the policy from one by RBAC."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

DRIVER_PODS_POLICY = "gpuplane-driver-own-node-pods"
DAEMON_LABELS = {
    "app.kubernetes.io/name": "gpuplane-mps-control-daemon",
    "app.kubernetes.io/component": "mps-control-daemon",
}


def _base_driver_image() -> str:
    """The driver image of the base manifests (what the rbac tests install): ``images`` of the base kustomization."""
    kustomization = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "manifests/base/kustomization.yaml").read_text()
    )
    image = next(i for i in kustomization["images"] if i["name"] == "gpuplane-driver")
    return f"{image['newName']}:{image['newTag']}"


# The policy pins a daemon pod's image to the installed DaemonSet's repository (tests/e2e/test_rbac_narrow.py
# checks that this is the rendered DaemonSet's image).
DRIVER_IMAGE = _base_driver_image()


def daemon_pod(name: str, node: str, claim_uid: str = "") -> dict[str, Any]:
    """An MPS control-daemon pod as the driver makes it (--mps-daemons=pod): the contract the policy enforces."""
    claim_uid = claim_uid or str(uuid.uuid4())
    mps = f"/var/lib/kubelet/plugins/gpu.gpuplane.dev/mps/{claim_uid}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {**DAEMON_LABELS, "gpuplane.dev/node": node, "gpuplane.dev/claim-uid": claim_uid},
        },
        "spec": {
            "nodeName": node,
            "hostPID": True,
            "hostNetwork": True,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "mps-control-daemon",
                    "image": DRIVER_IMAGE,
                    "command": ["nvidia-cuda-mps-control", "-f"],
                    "env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": f"{mps}/pipe"}],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "mps", "mountPath": mps}, {"name": "shm", "mountPath": "/dev/shm"}],
                }
            ],
            "volumes": [
                {"name": "mps", "hostPath": {"path": mps, "type": "DirectoryOrCreate"}},
                {"name": "shm", "hostPath": {"path": f"{mps}/shm", "type": "DirectoryOrCreate"}},
            ],
        },
    }


def refused_by(policy: str, call: Any, *args: Any, **kw: Any) -> str:
    """The call is refused (403) by ``policy`` (or by RBAC when ``policy`` is empty); the API's message."""
    with pytest.raises(ApiException) as err:
        call(*args, **kw)
    body = str(err.value.body)
    assert err.value.status == 403, body
    if policy:
        assert f"ValidatingAdmissionPolicy '{policy}'" in body, body
    else:
        assert "ValidatingAdmissionPolicy" not in body and "forbidden" in body.lower(), body
    print(f"refused: {body[:400]}")
    return body


def policy_refusal(call: Any, *args: Any) -> str:
    """The message when ``call`` is refused by the driver's pod policy; "" while RBAC still refuses it first."""
    try:
        call(*args)
    except ApiException as err:
        if err.status == 403 and DRIVER_PODS_POLICY in str(err.body):
            return str(err.body)
        if err.status == 403:
            return ""
        raise
    raise AssertionError(f"{call.__name__}{args} was admitted")
