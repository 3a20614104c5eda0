"""gpuplane-controller: read the config once, configure logging once, run the kopf operator.

Two or more replicas run with kopf peering: each has a distinct priority
(``--peering-priority``, by default derived from the replica's identity), the
live replica with the highest priority works and the others stand by, and a
replica that stops renewing its peering record for ``--peering-lifetime``
seconds is presumed dead, so a standby takes over. Every decision lives in
the API (gang status, claim annotations and owner references), so the new
leader resumes exactly where the old one stopped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import kopf
import structlog
from kopf._core.engines import peering  # the Identity type kopf.run takes
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller import config, handlers, kube, metrics, names, runtime
from driver import logs

log = structlog.get_logger(__name__)


def _login(cfg: config.ControllerConfig) -> kopf.ConnectionInfo:
    """Credentials for kopf from the same kubeconfig (or service account) as our API client."""
    api = kube.make_api_client(cfg.kubeconfig)
    c = api.configuration
    token = (c.api_key or {}).get("authorization") or (c.api_key or {}).get("BearerToken")
    scheme = None
    if token and " " in token:
        scheme, token = token.split(" ", 1)
    return kopf.ConnectionInfo(
        server=c.host,
        ca_path=c.ssl_ca_cert,
        insecure=not c.verify_ssl,
        certificate_path=c.cert_file,
        private_key_path=c.key_file,
        scheme=scheme,
        token=token,
    )


def ensure_peering(api: client.ApiClient, name: str) -> None:
    """Create the ClusterKopfPeering object the replicas meet in (the CRD comes from crds/)."""
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
    try:
        custom.create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuplane-controller`` console script."""
    cfg = config.parse_args(argv, os.environ)
    logs.configure(cfg.log_level, cfg.log_format)
    api = kube.make_api_client(cfg.kubeconfig)
    m = metrics.ControllerMetrics()
    if cfg.metrics_port:
        m.serve(cfg.metrics_port)
    if not cfg.standalone:
        ensure_peering(api, cfg.peering_name)
    memo = runtime.Runtime.create(cfg, kube.KubeWriter(api), m)
    registry = handlers.make_registry(cfg)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return _login(cfg)

    log.info(
        "starting",
        identity=cfg.identity,
        priority=cfg.peering_priority,
        peering=cfg.peering_name,
        standalone=cfg.standalone,
    )
    kopf.run(
        registry=registry,
        memo=memo,
        standalone=cfg.standalone,
        priority=cfg.peering_priority,
        peering_name=cfg.peering_name,
        clusterwide=True,
        identity=peering.Identity(f"{cfg.identity}@{names.COMPONENT}"),
        liveness_endpoint=cfg.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
