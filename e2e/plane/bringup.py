"""``python -m e2e up``'s steps: the control plane, gpuplane installed, the nodes, the controllers, the addons.

``bring_up(state_dir, groups, out, ...)`` starts (or reuses) everything recorded in ``state_dir`` and
returns the admin kubeconfig; ``stop_all`` stops it (``down``). With real nodes gpuplane is installed
as pods on them (``install_step``: ``e2e.plane.podinstall``) and the controllers are the Deployment's
pods (``controller_step``); without, ``manifests/overlays/e2e`` and host-process controllers
(``e2e.plane.components``). Simulated nodes' drivers are host processes either way (``start_nodes``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from e2e.cluster import addon_build, addons, build, controlplane
from e2e.cluster import handle as cluster
from e2e.plane import components, identity, nodes, podinstall, simnodes
from e2e.plane.realnode import cli as realnodes

Printer = Callable[[str], None]
DEFAULT_ADDONS: tuple[str, ...] = ("jobset", "lws")


def start_nodes(
    state_dir: Path,
    handle: cluster.Cluster,
    groups: Sequence[nodes.NodeGroup],
    out: Printer,
) -> None:
    """The ``nodes`` step of ``up``: start simulated GPU nodes (drivers under their own identity) and leave them."""
    if not groups:
        out("nodes: none requested")
        return
    described = ", ".join(f"{g.count}x {g.profile}" for g in groups)
    out(f"nodes: starting {described} (each: gpuplane-driver as ServiceAccount gpuplane-driver, a kubelet stand-in)")
    credentials = components.driver_credentials(
        handle, components.identities_dir(state_dir), seconds=identity.LONG_TOKEN_SECONDS
    )
    sim = simnodes.SimNodes(state_dir, handle.kubeconfig, driver_credentials=credentials, out=out)
    started = sim.start(groups)
    sim.detach()
    out(f"nodes ready: {', '.join(n.name for n in started)}")


def start_controllers(state_dir: Path, handle: cluster.Cluster, replicas: int, out: Printer) -> None:
    """The ``controller`` step of ``up``: the controller replicas (reused when all of them run)."""
    ctl = components.Controllers(
        state_dir, handle, replicas=replicas, token_seconds=identity.LONG_TOKEN_SECONDS, out=out
    )
    if replicas <= 0:
        components.stop_controllers(state_dir, out=out)
        out("controller: none requested")
        return
    if ctl.all_running():
        out(f"controller: {replicas} replica(s) already running (reusing them)")
        return
    out(
        f"controller: starting {replicas} gpuplane-controller replica(s) as ServiceAccount gpuplane-controller "
        f"(leader election on the Lease {identity.NAMESPACE}/{components.LEASE_NAME})"
    )
    ctl.start()
    ctl.detach()


def install_step(
    state_dir: Path, handle: cluster.Cluster, real_groups: Sequence[nodes.NodeGroup], replicas: int, out: Printer
) -> None:
    """gpuplane from ``manifests/``: as pods on real nodes where there are any, else the e2e overlay.

    With real nodes they start here, without a driver, and gpuplane is installed as an operator installs
    it (``e2e.plane.podinstall``): the images built from the Dockerfiles, ``kubectl apply -k`` of the local
    overlay, the driver DaemonSet's pod on each real node and the controller Deployment's pods on them.
    Without, ``manifests/overlays/e2e`` (its workloads pinned off the simulated nodes, which cannot run
    containers); the drivers and the controllers are then host processes (``e2e.plane.components``).
    """
    if not real_groups:
        out(
            "install: kubectl apply -k manifests/overlays/e2e (no real node: the driver and the controllers "
            "run as host processes)"
        )
        components.install(handle, out)
        return
    out(
        "install: real nodes first, then gpuplane on them as an operator installs it: images from "
        "Dockerfile.driver/Dockerfile.controller, kubectl apply -k of manifests/overlays/local"
    )
    podinstall.start_up(state_dir, handle, real_groups, replicas=replicas, out=out)


def controller_step(state_dir: Path, handle: cluster.Cluster, replicas: int, out: Printer) -> None:
    """The controllers: the Deployment's pods where gpuplane runs as pods, else host processes."""
    if podinstall.recorded(state_dir) is None:
        start_controllers(state_dir, handle, replicas, out)
        return
    components.stop_controllers(state_dir, out=out)  # a host controller of an earlier `up` would share the Lease
    out(
        f"controller: the gpuplane-controller Deployment's {replicas} pod(s), on the real node(s) "
        f"(leader election on the Lease {identity.NAMESPACE}/{components.LEASE_NAME}); "
        f"logs: kubectl logs -n {identity.NAMESPACE} deployment/gpuplane-controller"
    )


def start_addons(handle: cluster.Cluster, names: Sequence[str], out: Printer) -> None:
    """The ``addons`` step of ``up``: build (once) and start each workload controller (reused when it runs)."""
    if not names:
        out("addons: none requested")
        return
    for name in names:
        addon = addons.Addon(handle, addon_build.ensure_addon(name, out=out), out=out)
        addon.start()
        addon.detach()


def parse_addons(text: str) -> list[str]:
    """``jobset,lws`` -> the names (each checked against the recipes)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        addon_build.recipe(name)  # ValueError names the known ones
    return names


def _clear_node_state(state_dir: Path) -> None:
    for node in simnodes.load_nodes(state_dir):
        shutil.rmtree(node.socket_dir, ignore_errors=True)
    for path in (state_dir / "nodes", state_dir / "s", simnodes.socket_root(state_dir)):
        shutil.rmtree(path, ignore_errors=True)
    simnodes.nodes_file(state_dir).unlink(missing_ok=True)


def stop_all(state_dir: Path, out: Printer) -> list[str]:
    """Stop everything recorded in ``state_dir``: controllers, nodes, then the control plane."""
    stopped = components.stop_controllers(state_dir, out=out)
    stopped += realnodes.stop_nodes(state_dir, out=out)
    podinstall.forget(state_dir)
    stopped += simnodes.stop_nodes(state_dir, out=out)
    stopped += controlplane.stop_state_dir(state_dir, out=out)
    return stopped


def bring_up(
    state_dir: Path,
    groups: Sequence[nodes.NodeGroup],
    out: Printer,
    *,
    controllers: int = components.DEFAULT_REPLICAS,
    addon_names: Sequence[str] = DEFAULT_ADDONS,
    real_groups: Sequence[nodes.NodeGroup] = (),
) -> Path:
    """Start (or reuse) the control plane, gpuplane, the nodes and the controllers of ``state_dir``.

    Returns the admin kubeconfig.
    """
    alive = {name: r for name, r in controlplane.running(state_dir).items() if name in controlplane.COMPONENTS}
    kubeconfig = state_dir / "kubeconfig"
    if set(alive) == set(controlplane.COMPONENTS):
        bins = build.ensure_binaries(out=out)
        handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
        try:
            as_pods = podinstall.recorded(state_dir) is not None
            if not as_pods:
                components.install(handle, out)
            sim = simnodes.SimNodes(state_dir, kubeconfig, out=out)
            real_ok = realnodes.running(state_dir, handle, host_driver=not as_pods) or not real_groups
            if real_ok and (sim.all_running() or (not groups and not sim.nodes)):
                out(f"control plane and {len(sim.nodes)} node(s) in {state_dir} already running (reusing them)")
                if as_pods:
                    out("install: applying this tree's install again (an upgrade if it changed)")
                    podinstall.reinstall(state_dir, handle, replicas=controllers, out=out)
            else:
                out(f"control plane in {state_dir} is running; (re)starting its nodes")
                realnodes.stop_nodes(state_dir, out=out)
                simnodes.stop_nodes(state_dir, out=out)
                podinstall.forget(state_dir)
                _clear_node_state(state_dir)
                install_step(state_dir, handle, real_groups, controllers, out)
                start_nodes(state_dir, handle, groups, out)
            controller_step(state_dir, handle, controllers, out)
            start_addons(handle, addon_names, out)
        finally:
            handle.close()
        return kubeconfig
    if controlplane.running(state_dir) or simnodes.load_nodes(state_dir):
        out(f"stopping the remains of a previous cluster in {state_dir}")
        stop_all(state_dir, out)
    _clear_node_state(state_dir)
    shutil.rmtree(components.identities_dir(state_dir), ignore_errors=True)
    started = time.monotonic()
    out("step 1/6: binaries")
    bins = build.ensure_binaries(out=out)
    out(f"step 2/6: control plane (state in {state_dir})")
    plane = controlplane.ControlPlane(state_dir, bins, out=out)
    kubeconfig = plane.start()
    handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
    try:
        info = {
            "server": plane.server,
            "kubeconfig": str(kubeconfig),
            "bins": str(bins.directory),
            "nodes": [{"profile": g.profile, "count": g.count} for g in groups],
            "real_nodes": [{"profile": g.profile, "count": g.count} for g in real_groups],
            "controllers": controllers,
            "addons": list(addon_names),
            "feature_gates": plane.feature_gates,
            "runtime_config": plane.runtime_config,
        }
        (state_dir / "cluster.json").write_text(json.dumps(info, indent=2) + "\n")
        out("step 3/6: install gpuplane from manifests/")
        install_step(state_dir, handle, real_groups, controllers, out)
        out("step 4/6: simulated nodes")
        start_nodes(state_dir, handle, groups, out)
        out("step 5/6: controller")
        controller_step(state_dir, handle, controllers, out)
        out("step 6/6: workload controllers")
        start_addons(handle, addon_names, out)
    except BaseException:
        components.stop_controllers(state_dir, out=out)
        realnodes.stop_nodes(state_dir, out=out)
        simnodes.stop_nodes(state_dir, out=out)
        plane.stop()
        raise
    finally:
        handle.close()
    plane.detach()
    out(f"cluster up in {time.monotonic() - started:.1f}s; stop it with `python -m e2e down --state-dir {state_dir}`")
    return kubeconfig
