"""The IMEX branch of ``gpuplane-driver-own-node-pods``, under the driver's own node-bound token.

With ``--imex-daemons=pod`` the driver creates one IMEX daemon pod per domain on its node
(:mod:`gpuplane.driver.sharing.imex_pods`). The pod as the driver renders it (template from the rendered DaemonSet,
as the driver copies it from its own pod) is admitted and deleted on the token's node; the same pod for another
node, or with a hostPath that is not ``<plugin dir>/imex``, is refused with the policy's reason (server-side dry
runs for the refusals, nothing stored).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.cluster import handle as cluster
from e2e.plane import identity, install
from gpuplane.driver.kube import KubeApi
from gpuplane.driver.sharing import imex_pods, mps_pods
from tests.daemonpods import DRIVER_PODS_POLICY, refused_by
from tests.rbackit import (
    driver_a_fixture,  # noqa: F401  (fixture driver_a)
    installed_fixture,  # noqa: F401  (fixture installed)
    two_nodes_fixture,  # noqa: F401  (fixture two_nodes)
)

pytestmark = pytest.mark.e2e

IMEX_DIR = Path("/var/lib/kubelet/plugins/gpu.gpuplane.dev/imex")  # --plugin-dir + /imex


def test_the_drivers_imex_daemon_pods_pass_the_policy_and_nothing_else_does(
    installed: cluster.Cluster, two_nodes: tuple[str, str], driver_a: identity.Identity
) -> None:
    node_a, node_b = two_nodes
    ds = next(o for o in install.render(installed) if o["kind"] == "DaemonSet")
    own_pod = {"metadata": {"namespace": identity.NAMESPACE}, "spec": {**ds["spec"]["template"]["spec"]}}
    own_pod["spec"]["nodeName"] = node_a
    template = mps_pods.PodTemplate.from_driver_pod(own_pod, IMEX_DIR)
    body = imex_pods.daemon_pod(template, IMEX_DIR, "imex-e2e", "nvidia-imex")
    name = body["metadata"]["name"]
    api = driver_a.api_client()
    core = client.CoreV1Api(api)
    try:
        KubeApi(api).create_pod(identity.NAMESPACE, body)
        print(f"admitted: IMEX daemon pod {name} on {node_a}")

        elsewhere = copy.deepcopy(body)
        elsewhere["metadata"]["name"] = "gpuplane-imex-elsewhere"
        elsewhere["spec"]["nodeName"] = node_b
        elsewhere["metadata"]["labels"]["gpuplane.dev/node"] = node_b
        said = refused_by(DRIVER_PODS_POLICY, core.create_namespaced_pod, identity.NAMESPACE, elsewhere, dry_run="All")
        assert f"on node '{node_a}' may create pods only on its own node" in said, said

        wider = copy.deepcopy(body)
        wider["metadata"]["name"] = "gpuplane-imex-wider"
        wider["spec"]["volumes"][0]["hostPath"]["path"] = "/var/lib/kubelet"
        said = refused_by(DRIVER_PODS_POLICY, core.create_namespaced_pod, identity.NAMESPACE, wider, dry_run="All")
        assert "IMEX daemon pods only" in said and "/imex" in said, said

        KubeApi(api).delete_pod(identity.NAMESPACE, name)
    finally:
        api.close()
        try:
            client.CoreV1Api(installed.api).delete_namespaced_pod(name, identity.NAMESPACE, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
