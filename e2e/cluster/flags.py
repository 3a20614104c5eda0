"""The command line of each control-plane component: feature gates, API versions, ports, certificates.

The feature gates and API versions enabled go to apiserver, scheduler and controller-manager
alike; see ``DEFAULT_FEATURE_GATES`` for what and why. Pure: paths and ports in, argv out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from e2e.cluster import pki, releases

# Per release (e2e.cluster.releases): a gate a release does not know, or an API version it does not serve,
# stops the component at start-up.
DEFAULT_FEATURE_GATES: Mapping[str, bool] = releases.RUNNING.feature_gates
DEFAULT_RUNTIME_CONFIG: Mapping[str, bool] = releases.RUNNING.runtime_config

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"


def format_gates(gates: Mapping[str, bool]) -> str:
    """``{"A": True}`` -> ``A=true``."""
    return ",".join(f"{name}={str(on).lower()}" for name, on in sorted(gates.items()))


def qps_flags(client_qps: int | None) -> list[str]:
    """Client-side rate limit of kube-scheduler and kube-controller-manager (None: the upstream defaults)."""
    if client_qps is None:
        return []
    return [f"--kube-api-qps={client_qps}", f"--kube-api-burst={2 * client_qps}"]


def etcd_argv(binary: Path, data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    """etcd on loopback, one member, no fsync (a throwaway test cluster)."""
    return [
        str(binary),
        "--name=e2e",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=e2e={peer_url}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync=true",  # a throwaway test cluster; fsync dominates on slow disks
        "--log-level=warn",
    ]


def apiserver_argv(
    binary: Path,
    state_dir: Path,
    *,
    port: int,
    client_url: str,
    cluster_pki: pki.ClusterPKI,
    runtime_config: Mapping[str, bool],
    gates: str,
    verbosity: int,
) -> list[str]:
    """kube-apiserver on loopback with Node and RBAC authorization and NodeRestriction admission."""
    return [
        str(binary),
        f"--etcd-servers={client_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={state_dir / 'certs' / 'kube-apiserver'}",
        f"--tls-cert-file={cluster_pki.apiserver.cert}",
        f"--tls-private-key-file={cluster_pki.apiserver.key}",
        f"--client-ca-file={cluster_pki.ca.cert}",
        f"--service-account-key-file={cluster_pki.service_account_pub}",
        f"--service-account-signing-key-file={cluster_pki.service_account_key}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--admission-control-config-file={admission_config_path(state_dir)}",
        # The `kubernetes` Service cannot point at a loopback address; no pod needs it here.
        "--endpoint-reconciler-type=none",
        # Fills kube-system/extension-apiserver-authentication, which the
        # scheduler's and controller-manager's delegated authentication read.
        f"--requestheader-client-ca-file={cluster_pki.ca.cert}",
        "--requestheader-allowed-names=gpuplane-front-proxy",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--allow-privileged=true",
        # Real kubelets (e2e.cluster.realnode) listen on their node's InternalIP; their Hostname does not resolve.
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--kubelet-client-certificate={cluster_pki.kubelet_client.cert}",
        f"--kubelet-client-key={cluster_pki.kubelet_client.key}",
        f"--runtime-config={format_gates(runtime_config)}",
        f"--feature-gates={gates}",
        "--profiling=false",
        f"--v={verbosity}",
    ]


ENTITLED_PRIORITY_CLASSES = ("gpuplane-high", "gpuplane-urgent")
"""gpuplane's example PriorityClasses (issue 32): only a namespace with a ResourceQuota scoped to one may
run pods of it (ResourceQuota ``limitedResources``, the upstream way to grant a PriorityClass)."""


def admission_config_path(state_dir: Path) -> Path:
    """Where the apiserver's AdmissionConfiguration is written (:func:`admission_config`)."""
    return state_dir / "admission-config.json"


def admission_config() -> dict[str, object]:
    """The AdmissionConfiguration: pods of gpuplane's example PriorityClasses need a quota scoped to them."""
    limited = {
        "resource": "pods",
        "matchScopes": [{"scopeName": "PriorityClass", "operator": "In", "values": list(ENTITLED_PRIORITY_CLASSES)}],
    }
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": "ResourceQuota",
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "ResourceQuotaConfiguration",
                    "limitedResources": [limited],
                },
            }
        ],
    }


def _served(name: str, state_dir: Path, kubeconfig: Path, port: int) -> list[str]:
    """How kube-controller-manager and kube-scheduler reach the apiserver and serve their own port."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={state_dir / 'certs' / name}",
    ]


def _one_replica(gates: str, verbosity: int, client_qps: int | None) -> list[str]:
    """One replica (no leader election), the cluster's feature gates, log level and client rate limit."""
    return ["--leader-elect=false", f"--feature-gates={gates}", f"--v={verbosity}", *qps_flags(client_qps)]


def controller_manager_argv(
    binary: Path,
    state_dir: Path,
    *,
    port: int,
    kubeconfig: Path,
    cluster_pki: pki.ClusterPKI,
    gates: str,
    verbosity: int,
    client_qps: int | None,
) -> list[str]:
    """kube-controller-manager with every controller, signing with the cluster CA."""
    return [
        str(binary),
        *_served("kube-controller-manager", state_dir, kubeconfig, port),
        f"--service-account-private-key-file={cluster_pki.service_account_key}",
        f"--root-ca-file={cluster_pki.ca.cert}",
        f"--cluster-signing-cert-file={cluster_pki.ca.cert}",
        f"--cluster-signing-key-file={cluster_pki.ca.key}",
        "--use-service-account-credentials=true",
        "--controllers=*",
        *_one_replica(gates, verbosity, client_qps),
    ]


def scheduler_argv(
    binary: Path,
    state_dir: Path,
    *,
    port: int,
    kubeconfig: Path,
    gates: str,
    verbosity: int,
    client_qps: int | None,
) -> list[str]:
    """kube-scheduler, no leader election."""
    return [
        str(binary),
        *_served("kube-scheduler", state_dir, kubeconfig, port),
        *_one_replica(gates, verbosity, client_qps),
    ]
