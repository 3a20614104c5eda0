"""``kubectl gpuplane map`` through kubectl's plugin mechanism, on the session's cluster, as an admin and as tenants.

kubectl finds the executable ``kubectl-gpuplane`` (installed with the package, in the venv's bin) on PATH
and runs it with the caller's kubeconfig. Checked: the admin's map draws a claim the kube-scheduler
allocated on the node and GPU it got; a tenant with ``edit`` in its namespace only (no ``list`` on
ResourceSlices) is told there is no map and which permission to ask for (exit 3); a tenant that may list
slices but not every namespace's claims gets the map of its own allocations and a line saying the
rest was hidden, and never sees another namespace's claim. ``why`` says a running pod got its devices,
an unplaceable one why (kube-scheduler's message, or the controller's explanation on its claim), a
missing one that it is missing (exit 1), and a tenant asking about another namespace that it may not
(exit 3). ``usage`` charges the admin's namespace one whole GPU (and its price), shows a viewer its own
namespace only and says the rest was hidden, and refuses a tenant without slice access (exit 3).
``map -o html`` is rendered by Debian's headless Chromium: the admin's whole GPU is on screen in its
claim's colour (the screenshot kept in ``GPUPLANE_ARTEFACTS``). The shipped ClusterRole
``gpuplane-fleet-viewer`` sees every namespace's usage and may change nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpuplane.cli import fleethtml, fleetmap
from tests import browserkit
from tests.e2e import tenantkit
from tests.e2e.conftest import GpuCluster, eventually

pytestmark = pytest.mark.e2e

ADMIN_NS, TENANT_NS, VIEWER_NS = "gpuplane-plugin", "gpuplane-plugin-tenant", "gpuplane-plugin-viewer"
OPERATOR_NS = "gpuplane-plugin-operator"
NO_SUCH_GPU = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA B300"'  # no node has one


def plugin(gc: GpuCluster, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl gpuplane --kubeconfig=... ...`` with the venv's bin on PATH (kubectl passes every flag after a
    plugin's name to the plugin and refuses flags before it)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = [str(gc.cluster.bins.kubectl), "gpuplane", f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


def _allocated(gc: GpuCluster, ns: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = gc.cluster.custom.get_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaims", name
    )
    return got


def _bind(rbac: client.RbacAuthorizationV1Api, name: str, role: str, namespace: str) -> None:
    """A ClusterRoleBinding ``name`` of ClusterRole ``role`` to the ServiceAccount ``tenant`` of ``namespace``."""
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=name),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="tenant", namespace=namespace)],
        )
    )


@pytest.fixture(scope="module")
def placed(gpu_cluster: GpuCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    gc = gpu_cluster
    core = client.CoreV1Api(gc.cluster.api)
    out = tmp_path_factory.mktemp("plugin")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ADMIN_NS)))
    gc.cluster.apply(tenantkit.claim(ADMIN_NS, "admins-gpu", "gpu.gpuplane.dev"))
    gc.cluster.apply(tenantkit.pod(ADMIN_NS, "admins-pod", claim_name="admins-gpu"))
    never = tenantkit.claim(ADMIN_NS, "never-gpu", "gpu.gpuplane.dev")
    never["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": NO_SUCH_GPU}}]
    gc.cluster.apply(never)
    gc.cluster.apply(tenantkit.pod(ADMIN_NS, "never-pod", claim_name="never-gpu"))
    tenant = tenantkit.make_tenant(gc, "tenant", TENANT_NS, {}, out)
    viewer = tenantkit.make_tenant(gc, "viewer", VIEWER_NS, {}, out)
    tenantkit.make_tenant(gc, "operator", OPERATOR_NS, {}, out)  # given the shipped gpuplane-fleet-viewer below
    rbac = client.RbacAuthorizationV1Api(gc.cluster.api)
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name="gpuplane-plugin-slices"),
            rules=[client.V1PolicyRule(api_groups=["resource.k8s.io"], resources=["resourceslices"], verbs=["list"])],
        )
    )
    _bind(rbac, "gpuplane-plugin-slices", "gpuplane-plugin-slices", VIEWER_NS)
    _bind(rbac, "gpuplane-plugin-operator", "gpuplane-fleet-viewer", OPERATOR_NS)
    viewer.must_create(tenantkit.claim(VIEWER_NS, "viewers-gpu", "gpu.gpuplane.dev"))
    viewer.must_create(tenantkit.pod(VIEWER_NS, "viewers-pod", claim_name="viewers-gpu"))
    tenantkit.wait_running(gc, ADMIN_NS, ["admins-pod"], 120)
    tenantkit.wait_running(gc, VIEWER_NS, ["viewers-pod"], 120)
    eventually(lambda: bool(_allocated(gc, ADMIN_NS, "admins-gpu").get("status", {}).get("allocation")), 30, "alloc")
    try:
        yield {
            "admin": gc.cluster.kubeconfig,
            "tenant": out / "tenant.kubeconfig",
            "viewer": out / "viewer.kubeconfig",
            "operator": out / "operator.kubeconfig",
            "tenant_obj": tenant,
        }
    finally:
        rbac.delete_cluster_role_binding("gpuplane-plugin-operator")
        rbac.delete_cluster_role_binding("gpuplane-plugin-slices")
        rbac.delete_cluster_role("gpuplane-plugin-slices")
        tenantkit.delete_namespaces(gc, [ADMIN_NS, TENANT_NS, VIEWER_NS, OPERATOR_NS])


def test_the_admin_sees_the_claim_on_the_gpu_it_got(gpu_cluster: GpuCluster, placed: dict[str, Any]) -> None:
    result = _allocated(gpu_cluster, ADMIN_NS, "admins-gpu")["status"]["allocation"]["devices"]["results"][0]
    done = plugin(gpu_cluster, placed["admin"], "map", "--node", result["pool"], "--color", "never")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(result["pool"] + "  (")
    line = next(line for line in lines if line.strip().startswith(result["device"] + " "))
    assert f"{ADMIN_NS}/admins-gpu (exclusive)" in line, done.stdout
    assert "hidden:" not in done.stdout and "\x1b[" not in done.stdout
    assert lines[-1].startswith("1 nodes, ")


def test_a_tenant_without_slice_access_is_told_what_to_ask_for(gpu_cluster: GpuCluster, placed: dict[str, Any]) -> None:
    done = plugin(gpu_cluster, placed["tenant"], "map")
    assert done.returncode == 3 and done.stdout == ""
    assert "you may not list ResourceSlices" in done.stderr and "ask an administrator for `list`" in done.stderr


def test_a_viewer_without_a_namespace_is_told_to_name_one(gpu_cluster: GpuCluster, placed: dict[str, Any]) -> None:
    done = plugin(gpu_cluster, placed["viewer"], "map", "--color", "never")  # its context names no namespace
    assert done.returncode == 0, done.stderr
    assert "nor in default: no allocation is drawn (name your namespace with -n)" in done.stdout


def test_a_viewer_sees_its_own_allocations_and_is_told_the_rest_is_hidden(
    gpu_cluster: GpuCluster, placed: dict[str, Any]
) -> None:
    done = plugin(gpu_cluster, placed["viewer"], "-n", VIEWER_NS, "map", "--color", "never")
    assert done.returncode == 0, done.stderr
    assert f"{VIEWER_NS}/viewers-gpu (exclusive)" in done.stdout
    assert ADMIN_NS + "/" not in done.stdout
    assert f"hidden: you may not list ResourceClaims in every namespace: only {VIEWER_NS}'s allocations" in done.stdout


def _unschedulable(gc: GpuCluster) -> bool:
    pod = client.CoreV1Api(gc.cluster.api).read_namespaced_pod("never-pod", ADMIN_NS)
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or [])


def test_why_answers_for_a_running_pod_an_unplaceable_one_and_a_missing_one(
    gpu_cluster: GpuCluster, placed: dict[str, Any]
) -> None:
    ran = plugin(gpu_cluster, placed["admin"], "-n", ADMIN_NS, "why", "pod/admins-pod")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[0] == "why: running: every claim was allocated and prepared"
    assert f"claim {ADMIN_NS}/admins-gpu:" in ran.stdout and "  allocated: " in ran.stdout
    eventually(lambda: _unschedulable(gpu_cluster), 60, "never-pod reported Unschedulable")
    stuck = plugin(gpu_cluster, placed["admin"], "-n", ADMIN_NS, "why", "never-pod")
    assert stuck.returncode == 0, stuck.stderr
    first = stuck.stdout.splitlines()[0]
    assert first.startswith(("why: kube-scheduler cannot place the pod: ", "why: no device fits the claim now: ")), (
        first
    )
    assert f"claim {ADMIN_NS}/never-gpu:" in stuck.stdout and "  not allocated" in stuck.stdout
    assert "kube-scheduler: Unschedulable: " in stuck.stdout
    missing = plugin(gpu_cluster, placed["admin"], "-n", ADMIN_NS, "why", "claim/nope")
    assert missing.returncode == 1 and f"no pod or claim 'nope' in namespace {ADMIN_NS}" in missing.stderr


def test_why_about_another_namespace_is_refused_to_a_tenant(gpu_cluster: GpuCluster, placed: dict[str, Any]) -> None:
    done = plugin(gpu_cluster, placed["tenant"], "-n", ADMIN_NS, "why", "pod/admins-pod")
    assert done.returncode == 3 and "not allowed" in done.stderr and "forbidden" in done.stderr


def test_usage_per_tenant_as_the_admin_and_as_a_viewer(gpu_cluster: GpuCluster, placed: dict[str, Any]) -> None:
    done = plugin(gpu_cluster, placed["admin"], "usage", "--price", "3")
    assert done.returncode == 0, done.stderr
    mine = next(line for line in done.stdout.splitlines() if line.startswith(ADMIN_NS + " "))
    # one claim, one whole GPU (never-gpu is not allocated, so not charged), 3 per hour at 3 per GPU-hour
    assert mine.split() == [ADMIN_NS, "1", "1", "1", "0", "0", "0", "0", "-", "3.00"], done.stdout
    assert f"{VIEWER_NS} " in done.stdout and "hidden:" not in done.stdout
    seen = plugin(gpu_cluster, placed["viewer"], "-n", VIEWER_NS, "usage", "-o", "json")
    assert seen.returncode == 0, seen.stderr
    report = json.loads(seen.stdout)
    assert [t["namespace"] for t in report["tenants"]] == [VIEWER_NS]
    assert report["tenants"][0]["gpus"] == 1 and report["tenants"][0]["claims"] == [f"{VIEWER_NS}/viewers-gpu"]
    assert report["hidden"] and "only " + VIEWER_NS in report["hidden"][0]
    refused = plugin(gpu_cluster, placed["tenant"], "usage")
    assert refused.returncode == 3 and "kubectl gpuplane usage: you may not list ResourceSlices" in refused.stderr


def test_the_html_map_renders_in_a_real_browser(
    gpu_cluster: GpuCluster, placed: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _allocated(gpu_cluster, ADMIN_NS, "admins-gpu")["status"]["allocation"]["devices"]["results"][0]
    done = plugin(gpu_cluster, placed["admin"], "map", "--node", result["pool"], "-o", "html")
    assert done.returncode == 0, done.stderr
    assert f'title="{ADMIN_NS}/admins-gpu: whole GPU (exclusive)"' in done.stdout
    page = tmp_path / "fleet.html"
    page.write_text(done.stdout)
    out = Path(os.environ.get("GPUPLANE_ARTEFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    png = out / "fleet-map-e2e.png"
    browserkit.screenshot(page, png, width=1400, height=600)
    seen = browserkit.colours(browserkit.read_png(png))
    held = sum(seen[browserkit.hex_pixel(c)] for c in fleethtml.CSS_COLOURS.values())
    free = seen[browserkit.hex_pixel(fleethtml.FREE)]
    # A GPU in the MIG offer (or MIG mode) publishes its 8 memory slices as counters and is drawn as 8 cells; any
    # other is published whole only (docs/mig-offer.md) and drawn as one block (gpuplane.cli.fleetmap).
    device = gpu_cluster.slice_devices()[(result["pool"], result["device"])]
    parsed = fleetmap.parse_device(device)
    assert parsed is not None, device
    cells = len(parsed.cells) or 1
    with capsys.disabled():
        print(
            f"\n[e2e] fleet map of {result['pool']} in Chromium: {png} ({held} px in claims' colours, {free} free; "
            f"the claim's GPU drawn as {cells} cell(s))"
        )
    assert held >= cells * 15 * 15, f"the whole GPU's {cells} cell(s) are not on screen in a claim's colour"
    assert free > 0


def test_the_shipped_fleet_viewer_role_sees_everything_and_changes_nothing(
    gpu_cluster: GpuCluster, placed: dict[str, Any]
) -> None:
    seen = plugin(gpu_cluster, placed["operator"], "usage")
    assert seen.returncode == 0, seen.stderr
    assert any(line.startswith(ADMIN_NS + " ") for line in seen.stdout.splitlines()), seen.stdout
    assert "hidden:" not in seen.stdout
    why = plugin(gpu_cluster, placed["operator"], "-n", ADMIN_NS, "why", "pod/admins-pod")
    assert why.returncode == 0 and why.stdout.startswith("why: running"), why.stderr
    argv = [str(gpu_cluster.cluster.bins.kubectl), f"--kubeconfig={placed['operator']}", "auth", "can-i"]
    for verb, what in (("delete", "resourceclaims"), ("create", "pods"), ("update", "resourceslices")):
        done = subprocess.run([*argv, verb, what, "-A"], capture_output=True, text=True, timeout=60, check=False)
        assert done.stdout.strip() == "no", f"the fleet viewer may {verb} {what}"
