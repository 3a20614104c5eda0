"""Replay trace claims on the real control plane (kube-scheduler allocating) and record what it did.

    python -m bench kube_replay [--nodes 8] [--claims 1200] [--load 1.0] [--file default] [--seed 0]
        [--rate 2.0] [--modes today,steered] [--out DIR]

Per mode, a fresh loopback control plane (v1.36.3, the e2e feature gates), gpuplane installed from
``manifests/`` (overlay e2e), ``--nodes`` simulated ``hgx-h100`` nodes (a real ``gpuplane-driver``
and a kubelet stand-in each) and one ``gpuplane-controller``. The workload is the placement
benchmark's load replay (``placement_bench.load_workload``: trace pods in order, Poisson arrivals
at ``--load`` x capacity, durations capped at 24 h, warm start) for a fleet of ``--nodes`` HGX
nodes, time-compressed so that requests arrive at ``--rate`` per second: each becomes a pod with
one ResourceClaim from a template (a MIG profile, or n whole GPUs with matchAttribute on the
NVLink domain); the pod is deleted its (compressed) duration after it was bound.

Modes: ``today``: drivers publish today's layout, the namespace is not opted in (the default
path). ``steered``: drivers run ``--steer-order --withhold-stranding --steer-mix=<the file's
mix>``, the namespace carries ``gpuplane.dev/steering=enabled`` (gate-and-steer).

Writes ``DIR/<mode>.json``: per request the arrival, create, gate, bind and claim times, node and
devices; every claim's allocation and release times; the final slices; each driver's slice-write
counters and the apiserver's ResourceSlice request counts. ``bench.kube.kube_compare`` reads them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.dra.dra_watch import wait
from bench.kube.kube_record import NAMESPACE, PodRecord, Recorder, apiserver_slice_requests, slice_writes
from bench.placement import trace
from e2e.cluster import build, controlplane
from e2e.cluster import handle as cluster
from e2e.plane import components, identity, nodes, simnodes
from gpuplane.placement import fragmentation, model

PAUSE = "registry.k8s.io/pause:3.10"
MIG_NAMES = {"1g": "1g.10gb", "2g": "2g.20gb", "3g": "3g.40gb", "4g": "4g.40gb"}
Say = Callable[[str], None]


def template_name(shape: fragmentation.Shape) -> str:
    """The ResourceClaimTemplate a request of ``shape`` uses."""
    return "t-" + shape.label().replace("(", "-").replace(")", "").replace(".", "-")


def template(shape: fragmentation.Shape) -> dict[str, Any]:
    """One ResourceClaimTemplate per request shape."""
    if shape.mig_profile:
        sel = f'device.attributes["gpu.gpuplane.dev"].migProfile == "{MIG_NAMES[shape.mig_profile]}"'
        devices: dict[str, Any] = {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": "mig.gpuplane.dev", "selectors": [{"cel": {"expression": sel}}]},
                }
            ]
        }
    else:
        n = shape.gpus_per_member
        devices = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev", "count": n}}]}
        if n > 1:
            devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": "gpu.gpuplane.dev/nvlinkDomain"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(shape), "namespace": NAMESPACE},
        "spec": {"spec": {"devices": devices}},
    }


def pod_body(name: str, shape: fragmentation.Shape) -> dict[str, Any]:
    """A pod with one claim from its shape's template and no CPU/memory requests."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name(shape)}],
            "containers": [{"name": "c", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def steer_args(mix: fragmentation.SizeMix) -> list[str]:
    """The driver flags of the steered mode."""
    text = ",".join(f"{s.label()}={100 * w:.3f}" for s, w in mix.shapes)
    return ["--steer-order", "--withhold-stranding", f"--steer-mix={text}"]


def run_mode(mode: str, work: trace.Workload, compression: float, args: argparse.Namespace, say: Say) -> dict[str, Any]:
    """Bring a cluster up for ``mode``, replay ``work`` on it, return the record (and tear it all down)."""
    bins = build.ensure_binaries(out=say)
    state = (args.out / f"state-{mode}").resolve()
    state.mkdir(parents=True, exist_ok=True)
    plane = controlplane.ControlPlane(state, bins, die_with_parent=True, client_qps=200, out=lambda _: None)
    say(f"[{mode}] control plane ...")
    kubeconfig = plane.start()
    handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state)
    sim: simnodes.SimNodes | None = None
    ctl: components.Controllers | None = None
    try:
        components.install(handle, lambda _: None)
        creds = components.driver_credentials(
            handle, components.identities_dir(state), seconds=identity.LONG_TOKEN_SECONDS
        )
        mix = trace.size_mix(args.pods, args.topo)
        sim = simnodes.SimNodes(
            state,
            kubeconfig,
            driver_credentials=creds,
            die_with_parent=True,
            driver_args=steer_args(mix) if mode == "steered" else (),
            out=lambda _: None,
        )
        say(f"[{mode}] {args.nodes} hgx-h100 nodes ...")
        sim.start([nodes.NodeGroup("hgx-h100", args.nodes)])
        ctl = components.Controllers(state, handle, replicas=1, die_with_parent=True, out=lambda _: None)
        ctl.start()
        labels = {"gpuplane.dev/steering": "enabled"} if mode == "steered" else {}
        handle.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}})
        for s in sorted(
            {fragmentation.shape_of(r) for r in work.requests} | {fragmentation.shape_of(r) for r, _ in work.prefill}
        ):
            handle.apply(template(s))
        wait(lambda: _service_account(handle), 60, "the namespace's default ServiceAccount")
        w0 = slice_writes(sim)
        a0 = apiserver_slice_requests(handle)
        record = replay(handle, work, compression, say, mode)
        record["slice_writes"] = {"before": w0, "after": slice_writes(sim)}
        record["apiserver_slices"] = {"before": a0, "after": apiserver_slice_requests(handle)}
        listed: Any = handle.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
        record["slices"] = listed["items"]
        record["nodes"] = [n.name for n in sim.started]
        return record
    finally:
        handle.close()
        if ctl is not None:
            ctl.stop()
        if sim is not None:
            sim.stop(remove=False)
        plane.stop()


def _service_account(handle: cluster.Cluster) -> bool:
    try:
        handle.core.read_namespaced_service_account("default", NAMESPACE)
        return True
    except client.exceptions.ApiException:
        return False


def replay(handle: cluster.Cluster, work: trace.Workload, compression: float, say: Say, mode: str) -> dict[str, Any]:
    """Create every request's pod at its (compressed) arrival, delete it its duration after it was bound."""
    reqs = [(r, 0.0, res, True) for r, res in work.prefill] + [
        (r, a, d, False) for r, a, d in zip(work.requests, work.arrivals, work.durations, strict=True)
    ]
    pods: dict[str, PodRecord] = {}
    order: list[str] = []
    for i, (r, a, d, pre) in enumerate(reqs):
        name = f"r{i:05d}"
        pods[name] = PodRecord(i, fragmentation.shape_of(r).label(), a / compression, d / compression, pre)
        order.append(name)
    shapes = {name: fragmentation.shape_of(reqs[pods[name].index][0]) for name in order}
    rec = Recorder(handle.api, pods)
    due: list[tuple[float, str]] = []
    due_lock = threading.Lock()

    def on_bound(name: str) -> None:
        p = pods[name]
        with due_lock:
            due.append(((p.bound or time.time()) + p.duration, name))

    rec.bound_cb = on_bound
    rec.start()
    time.sleep(1.0)
    core = handle.core
    t0 = time.time()
    for p in pods.values():
        p.arrival += t0
    end = t0 + max(p.arrival - t0 for p in pods.values())
    next_i = 0
    last_report = t0
    warm = sum(p.prefill for p in pods.values())
    say(f"[{mode}] replaying {len(order)} pods ({warm} warm-start) over {end - t0:.0f} s")
    while True:
        now = time.time()
        if next_i < len(order) and pods[order[next_i]].arrival <= now:
            name = order[next_i]
            try:
                body: Any = pod_body(name, shapes[name])
                core.create_namespaced_pod(NAMESPACE, body)
                pods[name].created = time.time()
            except client.exceptions.ApiException as exc:
                print(f"create {name}: {exc.status} {exc.reason}", file=sys.stderr, flush=True)
            next_i += 1
            continue
        with due_lock:
            due.sort()
            ready = [n for t, n in due if t <= now]
            due[:] = [(t, n) for t, n in due if t > now]
        for name in ready:
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
                pods[name].deleted = time.time()
        if next_i >= len(order) and now >= end:
            break
        if now - last_report > 30:
            bound = sum(1 for p in pods.values() if p.bound)
            say(f"[{mode}] t={now - t0:5.0f}s created {next_i}/{len(order)} bound {bound}")
            last_report = now
        nxt = pods[order[next_i]].arrival if next_i < len(order) else end
        with due_lock:
            if due:
                nxt = min(nxt, *(t for t, _ in due))
        time.sleep(max(0.0, min(0.2, nxt - time.time())))
    time.sleep(2.0)
    rec.stop.set()
    with rec.lock:
        return {
            "mode": mode,
            "t0": t0,
            "end": end,
            "compression": compression,
            "pods": {n: asdict(p) for n, p in pods.items()},
            "claims": {n: asdict(c) for n, c in rec.claims.items()},
        }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--claims", type=int, default=1200)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--file", default="default", choices=trace.FILES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=2.0, help="arrivals per wall-clock second")
    ap.add_argument("--modes", default="today,steered")
    ap.add_argument("--trace-dir", type=Path, default=trace.DEFAULT_TRACE)
    ap.add_argument("--out", type=Path, default=Path("/tmp/kube-replay"))
    args = ap.parse_args(argv)
    say: Say = lambda text: print(text, flush=True)  # noqa: E731
    args.out.mkdir(parents=True, exist_ok=True)
    args.pods, _ = trace.load_pods(args.trace_dir / f"openb_pod_list_{args.file}.csv")
    args.topo = trace.Topology(f"HGX {args.nodes}x8", args.nodes, 1, 8)
    work = trace.load_workload(args.pods, args.topo, args.load, args.seed, args.claims)
    span = work.arrivals[-1]
    compression = span / (len(work.arrivals) / args.rate)
    say(
        f"{len(work.requests)} requests (+{len(work.prefill)} warm start) on {args.nodes} HGX nodes"
        f" at load {args.load}, seed {args.seed}: {span:.0f} trace seconds compressed {compression:.0f}x"
        f" to {span / compression:.0f} s"
    )
    meta = {
        "nodes": args.nodes,
        "claims": args.claims,
        "load": args.load,
        "file": args.file,
        "seed": args.seed,
        "rate": args.rate,
    }
    for mode in args.modes.split(","):
        record = run_mode(mode, work, compression, args, say)
        record["meta"] = meta
        (args.out / f"{mode}.json").write_text(json.dumps(record))
        say(f"[{mode}] written {args.out / f'{mode}.json'}")
    return 0


def requests_of(work: trace.Workload) -> list[model.Request]:
    """Prefill then arrivals, in the order the replay creates them (index = pod number)."""
    return [r for r, _ in work.prefill] + list(work.requests)


if __name__ == "__main__":
    sys.exit(main())
