"""Invalid configs never hold devices (issue 18, defect 3), on the session's real ``gpu_cluster``.

- a config wrong on its own is refused at creation by the ValidatingAdmissionPolicy
  ``gpuplane-claim-configs`` (claims and templates), with the specific reason;
- a template claim only its DeviceClass shows wrong: the controller fails its pod at
  once (reason ``InvalidDeviceConfig``) and the generated claim's device is released;
- the policy agrees with the driver's models on generated configs and shares
  (server-side dry runs through the real admission chain).

Sorts after ``test_rbac*.py`` (whose own controller needs the Lease free).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes import client

from gpuplane.api import configs, quantity
from tests import strategies
from tests.e2e.conftest import GpuCluster, eventually
from tests.hostilekit import (
    apply_text,
    claim_body,
    events_of,
    ns_fixture,  # noqa: F401  (fixture ns)
    pod_body,
)

pytestmark = pytest.mark.e2e


def mps(**limits: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mps": limits},
    }


def sharing(strategy: str, key: str, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": strategy, key: fields},
    }


@pytest.fixture(scope="module", autouse=True)
def granted_gold(gpu_cluster: GpuCluster, ns: str) -> None:
    """The module's namespace may use every tier (tiers are entitlements, issue 32): configs are what is tested."""
    gpu_cluster.cluster.kubectl("label", "namespace", ns, "gpuplane.dev/max-tier=gold", "--overwrite")


REFUSED_AT_CREATION = {
    "huge-limit": (mps(defaultPinnedDeviceMemoryLimit="9" * 9800), None, "MPS pinned memory limits"),
    "pct-true": (mps(defaultActiveThreadPercentage=True), None, "defaultActiveThreadPercentage must be an integer"),
    "pct-string": (mps(defaultActiveThreadPercentage="50"), None, "defaultActiveThreadPercentage must be an integer"),
    "unknown-field": ({"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "GpuConfig", "x": 1}, None, "unknown field"),
    "bad-kind": ({"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "Gpu"}, None, "needs apiVersion"),
    "share-zero": (mps(), "0", "sharePercent must be a whole percentage 1..100"),
    # Consent to lower tiers is a class's (issue 15 audit D1): a claim's own is refused whatever its class.
    "share-with-lower-tiers-true": (
        sharing("TimeSlicing", "timeSlicing", interval="Short", shareWithLowerTiers=True),
        None,
        "timeSlicing.shareWithLowerTiers is the device class's choice, never a claim's",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_AT_CREATION))
def test_a_config_wrong_on_its_own_is_refused_at_creation(gpu_cluster: GpuCluster, ns: str, case: str) -> None:
    params, share, words = REFUSED_AT_CREATION[case]
    claim = claim_body(ns, f"refused-{case}", params, device_class="mps-bronze.gpu.gpuplane.dev")
    if share is not None:
        claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"sharePercent": share}}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"refused-{case}", "namespace": ns},
        "spec": {"spec": claim["spec"]},
    }
    for obj in (claim, template):
        with pytest.raises(Exception, match="gpuplane-claim-configs") as refused:
            gpu_cluster.cluster.apply(obj)
        assert words in str(refused.value), str(refused.value)
    ok = claim_body(ns, f"accepted-{case}", mps(defaultActiveThreadPercentage=10))
    gpu_cluster.cluster.kubectl("apply", "--dry-run=server", "-f", "-", input_text=json.dumps(ok))


# Fields the driver's models accept (issue 15's among them), each on a class whose own config lets the
# claim have it: the policy must admit every one (never refuse what the driver accepts).
ADMITTED = {
    "client-priority-below-normal": (
        "mps-silver.gpu.gpuplane.dev",
        sharing("MPS", "mps", clientPriority="BelowNormal"),
    ),
    "client-priority-normal": ("mps-gold.gpu.gpuplane.dev", sharing("MPS", "mps", clientPriority="Normal")),
    "mps-every-field": (
        "mps-silver.gpu.gpuplane.dev",
        sharing(
            "MPS",
            "mps",
            defaultActiveThreadPercentage=20,
            defaultPinnedDeviceMemoryLimit="8Gi",
            perDevicePinnedMemoryLimit={"gpu-0": "4Gi"},
            clientPriority="BelowNormal",
        ),
    ),
    "share-with-lower-tiers-false": (
        "timeslice-silver.gpu.gpuplane.dev",
        sharing("TimeSlicing", "timeSlicing", interval="Long", shareWithLowerTiers=False),
    ),
    "interval-on-the-plain-class": ("gpu.gpuplane.dev", sharing("TimeSlicing", "timeSlicing", interval="Short")),
}


@pytest.mark.parametrize("case", sorted(ADMITTED))
def test_every_field_the_driver_accepts_is_admitted(gpu_cluster: GpuCluster, ns: str, case: str) -> None:
    """Created for real (claim and template): the API server admits them, and the driver's own merge with
    the class's config (read from the cluster) accepts the same claim."""
    device_class, params = ADMITTED[case]
    dc = gpu_cluster.kubectl_json("get", "deviceclass", device_class)
    entries = [
        configs.SourcedConfig("FromClass", (), c["opaque"]["parameters"])
        for c in dc["spec"].get("config") or []
        if c.get("opaque", {}).get("driver") == "gpu.gpuplane.dev"
    ] + [configs.SourcedConfig("FromClaim", (), params)]
    configs.merge_configs(entries, "gpu", "gpu")  # the driver accepts it (raises ConfigError otherwise)
    claim = claim_body(ns, f"admitted-{case}", params, device_class=device_class)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"admitted-{case}", "namespace": ns},
        "spec": {"spec": claim["spec"]},
    }
    for obj in (claim, template):
        gpu_cluster.cluster.apply(obj)
    kept = gpu_cluster.kubectl_json("get", "resourceclaim", "-n", ns, f"admitted-{case}")
    assert kept["spec"]["devices"]["config"][0]["opaque"]["parameters"] == params
    gpu_cluster.kubectl_json("get", "resourceclaimtemplate", "-n", ns, f"admitted-{case}")


def test_a_template_claim_only_the_class_shows_wrong_fails_its_pod_and_frees_the_device(
    gpu_cluster: GpuCluster, ns: str
) -> None:
    gc = gpu_cluster
    mismatch = {"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "MigDeviceConfig"}  # on the whole-GPU class
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mismatch", "namespace": ns},
        "spec": {"spec": claim_body(ns, "x", mismatch)["spec"]},
    }
    pod = pod_body(ns, "from-template", "unused")
    pod["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "mismatch"}]
    apply_text(gc, json.dumps({"apiVersion": "v1", "kind": "List", "items": [template, pod]}))

    def failed() -> dict[str, Any] | None:
        p = gc.pod(ns, "from-template")
        return p if p["status"].get("phase") == "Failed" else None

    failed_pod = eventually(failed, 60, "the template claim's pod to fail")
    assert failed_pod["status"]["reason"] == "InvalidDeviceConfig"
    assert "kind 'MigDeviceConfig' does not apply to a 'gpu' device" in failed_pod["status"]["message"]

    generated = [s.get("resourceClaimName") for s in failed_pod["status"].get("resourceClaimStatuses") or []]
    assert generated and generated[0], failed_pod["status"]

    def released() -> bool:
        text = gc.cluster.kubectl(
            "get", "resourceclaim", "-n", ns, str(generated[0]), "--ignore-not-found", "-o", "json"
        )
        return not text.strip() or not (json.loads(text).get("status") or {}).get("allocation")

    eventually(released, 60, "the generated claim's device released")
    events = events_of(gc, ns, "from-template")
    assert any(
        e["reason"] == "InvalidDeviceConfig" and e["source"]["component"] == "gpuplane-controller" for e in events
    )


@pytest.mark.parametrize("field", ["config", "share"])
def test_the_admission_policy_agrees_with_the_drivers_models(gpu_cluster: GpuCluster, ns: str, field: str) -> None:
    """Generated configs and shares: the API server refuses exactly what the driver's models refuse.

    ``parse_claim_config`` / ``share_percent`` are context-free, as the policy is (what needs a DeviceClass is
    the controller's). Each case is a server-side dry-run create through the real admission chain.
    """
    custom = client.CustomObjectsApi(gpu_cluster.cluster.api)
    mismatches: list[str] = []
    checked = [0]

    def verdict(claim: dict[str, Any]) -> tuple[bool, str]:
        try:
            custom.create_namespaced_custom_object(
                "resource.k8s.io", "v1", ns, "resourceclaims", claim, dry_run="All", _preload_content=False
            )
        except client.ApiException as exc:
            return False, str(exc.body)[:300]
        return True, ""

    @settings(max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(value=strategies.opaque_config if field == "config" else strategies.share_text)
    def case(value: Any) -> None:
        try:
            json.dumps(value)
        except ValueError:
            return  # an int too long for JSON text cannot be sent
        if field == "config":
            claim = claim_body(ns, "agree", value)
            try:
                configs.parse_claim_config(value)
                model_ok = True
            except configs.ConfigError:
                model_ok = False
        else:
            claim = claim_body(ns, "agree", mps())
            claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"sharePercent": value}}
            try:
                quantity.share_percent(value)
                model_ok = True
            except ValueError:
                model_ok = False
        api_ok, why = verdict(claim)
        checked[0] += 1
        if api_ok != model_ok:
            mismatches.append(
                f"{value!r:.200}: model {'accepts' if model_ok else 'refuses'}, API server {why or 'accepts'}"
            )

    case()
    assert checked[0] >= 100
    assert not mismatches, "\n".join(mismatches[:8])
