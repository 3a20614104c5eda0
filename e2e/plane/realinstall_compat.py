"""What an install of a gpuplane older than the first real-node fixes needs to run on this machine's real nodes.

The upgrade tests install an earlier commit exactly as committed (``e2e.images.previous``).
Commits before ``FIXED_IN`` carry two bugs the first real-node run found and three
paths of this machine that they cannot take; an operator of such a version would work
around them in their install, and so does the generated kustomization
(``e2e.plane.realinstall.write_install``'s ``patches``), never the version's code:

* the controller's kopf identity came from ``getpass.getuser()``, which raises in the
  image (uid 65532 has no passwd entry): ``LOGNAME`` in the controller's environment
  gives getuser() a name (every controller pod crash-looped without it);
* the driver DaemonSet had no startupProbe, so on a loaded machine liveness killed the
  driver while it was still importing: the startupProbe of ``FIXED_IN`` is added;
* the driver did not resolve symlinks in its socket dirs, and the overlay's
  ``<host root>/<node>/kubelet`` link makes the registration socket's path pass
  AF_UNIX's 107 bytes: the plugin and registry dirs are given as the node's short
  kubelet root. That path is one node's, so this works for a one-node install only.

:func:`needs_compat` says whether a commit predates ``FIXED_IN`` (git ancestry);
:func:`patches` returns the kustomize patches.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.plane import realinstall

FIXED_IN = "6aa6d0316f2d5e4140523349e33a879bc005c519"
"""main's commit with the startupProbe and the kopf identity (and, before it, resolved socket dirs)."""
STARTUP_PROBE = {
    "httpGet": {"path": "/healthz", "port": "metrics"},
    "periodSeconds": 10,
    "timeoutSeconds": 5,
    "failureThreshold": 30,
}
CONTROLLER_LOGNAME = "gpuplane-controller"


def needs_compat(repo: Path, commit: str, fixed_in: str = FIXED_IN) -> bool:
    """True when ``commit`` is not ``fixed_in`` or a descendant of it."""
    done = subprocess.run(
        ["git", "-C", str(repo), "merge-base", "--is-ancestor", fixed_in, commit],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"git merge-base {fixed_in[:12]} {commit[:12]}: {done.stderr.decode().strip()}")
    return done.returncode == 1


def _driver_args(rendered: str, layout: realinstall.Layout, node: realinstall.Node) -> list[str]:
    for doc in yaml.safe_load_all(rendered):
        if doc and doc.get("kind") == "DaemonSet" and doc["metadata"]["name"] == realinstall.DAEMONSET:
            args: list[str] = doc["spec"]["template"]["spec"]["containers"][0]["args"]
            link = f"{layout.nodes_root}/$(NODE_NAME)/kubelet/"
            return [a.replace(link, f"{node.kubelet_root.resolve()}/") for a in args]
    raise ValueError("the rendered overlay has no driver DaemonSet")


def patches(rendered: str, layout: realinstall.Layout, nodes: Sequence[realinstall.Node]) -> list[dict[str, Any]]:
    """The kustomize patches (see the module docstring) for ``rendered`` (the overlay, host root substituted)."""
    if len(nodes) != 1:
        raise ValueError(f"an install older than {FIXED_IN[:12]} works on one real node only, not {len(nodes)}")
    (node,) = nodes
    driver = [
        {"op": "add", "path": "/spec/template/spec/containers/0/startupProbe", "value": STARTUP_PROBE},
        {
            "op": "replace",
            "path": "/spec/template/spec/containers/0/args",
            "value": _driver_args(rendered, layout, node),
        },
    ]
    controller = [
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/env/-",
            "value": {"name": "LOGNAME", "value": CONTROLLER_LOGNAME},
        }
    ]
    return [
        {"target": {"kind": "DaemonSet", "name": realinstall.DAEMONSET}, "patch": yaml.safe_dump(driver)},
        {"target": {"kind": "Deployment", "name": realinstall.DEPLOYMENT}, "patch": yaml.safe_dump(controller)},
    ]
