"""DRA overhead: apply-to-Running for pods with GPU claims next to the same pods without claims.

    python -m bench dra_overhead [--pods 100] [--nodes 8] [--claims mig|mps|timeslice] [--rounds 1]
        [--api-qps N] [--stages] [--write docs/benchmarks.md]

Starts its own loopback control plane and ``--nodes`` simulated ``hgx-h100``
nodes (each a real ``gpuplane-driver`` and a kubelet stand-in, see
``e2e.plane.simnodes``), then, per round, applies ``--pods`` pods without claims
with one ``kubectl apply``, waits until all run and deletes them, then does
the same with ``--pods`` pods that each get a GPU claim from a
ResourceClaimTemplate. Per pod, latency = time from the start of the
``kubectl apply`` until a watch sees the pod Running. The claim path adds the
resourceclaim controller (claim per pod), the scheduler's DRA allocator, the
stand-in's claim checks and ``NodePrepareResources`` (MIG instance creation or
an MPS daemon start in the driver, CDI spec write + checkpoint).

8 HGX nodes have 64 GPUs, so 100 exclusive whole GPUs do not fit at once:
``--claims mig`` (the default) gives every pod a ``1g.10gb`` MIG device (448
placements; the driver creates a real simulated MIG instance per claim);
``--claims mps`` gives every pod a 50 % share of a GPU through the
``mps-bronze`` class (two claims per GPU, one MPS control daemon per claim).

Prints p50/p99/max per kind and the ratios; ``--write FILE`` appends a
section to FILE (another tool writes there too: it is only ever appended to).

``--stages`` also breaks each pod's time into stages, from watch arrival
times in this process (pods: bound, ``status.resourceClaimStatuses`` written,
Running; ResourceClaims: created, ``status.allocation`` first seen), the
kubelet stand-ins' per-pod timing lines (wait for claims, claim reads,
``NodePrepareResources``, Running status write) and the drivers'
``gpuplane_driver_rpc_duration_seconds{op="prepare"}`` sum/count over the
measured claim rounds; it prints p50/p99/max/mean per stage, then the CPU
seconds each component (and the whole machine, from ``/proc/stat``) spent
from the apply until the last pod ran.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.dra.dra_setup import NAMESPACE, claim_template, pod  # noqa: E402
from bench.dra.dra_stages import (  # noqa: E402
    Stages,
    add_cpu,
    collect_stages,
    cpu_seconds,
    cpu_table,
    driver_prepare_metrics,
    node_lines,
    stage_table,
)
from bench.dra.dra_watch import ClaimWatch, RunningWatch, wait  # noqa: E402
from bench.fleet import fleet_probe  # noqa: E402
from bench.placement.placement_report import percentile  # noqa: E402
from e2e.cluster import build, controlplane  # noqa: E402
from e2e.cluster import handle as cluster  # noqa: E402
from e2e.plane import nodes, simnodes  # noqa: E402


def run_round(
    handle: cluster.Cluster,
    label: str,
    count: int,
    with_claim: bool,
    timeout: float,
    *,
    stages: Stages | None = None,
    sim: simnodes.SimNodes | None = None,
    waits: collections.Counter[str] | None = None,
    cpu: dict[str, float] | None = None,
) -> list[float]:
    """Apply ``count`` pods in one kubectl apply; return each pod's apply-to-Running latency (s).

    With ``stages`` (and ``sim``), also add the per-pod stage durations to it.
    """
    names = [f"{label}-{i:03d}" for i in range(count)]
    text = "\n---\n".join(json.dumps(pod(n, label, with_claim)) for n in names)
    watcher = RunningWatch(handle.api, label)
    watcher.start()
    claims = ClaimWatch(handle.api) if with_claim and stages is not None else None
    if claims is not None:
        claims.start()
    cpu_before = cpu_seconds(handle.state_dir) if cpu is not None and handle.state_dir else {}
    started = time.monotonic()
    handle.kubectl("apply", "-f", "-", input_text=text, timeout=timeout)
    try:
        wait(lambda: len(watcher.running) == count, timeout, f"{count} pods of {label} Running")
        if cpu is not None and handle.state_dir:
            add_cpu(cpu, cpu_before, cpu_seconds(handle.state_dir))
            cpu["wall (apply -> last Running)"] = cpu.get("wall (apply -> last Running)", 0.0) + (
                max(watcher.running.values()) - started
            )
    finally:
        handle.kubectl("delete", "pods", "-n", NAMESPACE, "-l", f"bench-round={label}", "--wait=false")
    latencies = [watcher.running[n] - started for n in names]
    if stages is not None:
        node = node_lines(sim, names, waits if waits is not None else collections.Counter()) if sim is not None else {}
        collect_stages(stages, started, names, pods=watcher, claims=claims, node=node)
    if claims is not None:
        claims.stop()
    wait(lambda: watcher.gone >= set(names), timeout, f"pods of {label} deleted")
    watcher.stop()
    if with_claim:  # the generated claims go once their pods are gone
        wait(
            lambda: not json.loads(handle.kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "json"))["items"],
            timeout,
            "claims deleted",
        )
    return latencies


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50, p99, max, mean."""
    return {
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def markdown(args: argparse.Namespace, plain: dict[str, float], dra: dict[str, float], rounds: int) -> str:
    """The section appended to the benchmarks file."""
    cpu = fleet_probe.cpu_model()
    claim = {
        "mig": "one `1g.10gb` MIG device per pod (ResourceClaimTemplate, class `mig.gpuplane.dev`)",
        "mps": "a 50 % MPS share per pod (class `mps-bronze.gpu.gpuplane.dev`, `sharePercent: 50`)",
        "timeslice": "a 50 % time-sliced share of a whole GPU per pod (class `gpu.gpuplane.dev`, "
        "`sharePercent: 50`, `TimeSlicing` config)",
    }[args.claims]
    ratio = {k: dra[k] / plain[k] for k in ("p50", "p99", "max")}
    release = build.read_pins(build.MODULE_DIR / "go.mod").kubernetes
    verdict = "meets" if ratio["p50"] <= 1.5 and ratio["p99"] <= 1.5 else "misses"
    return f"""
## DRA overhead: apply-to-Running, {args.pods} pods with and without GPU claims ({datetime.date.today()})

`python -m bench dra_overhead --pods {args.pods} --nodes {args.nodes} --claims {args.claims} --rounds {rounds}`
on {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}: a loopback control plane
(etcd, kube-apiserver, kube-scheduler, kube-controller-manager {release}) and {args.nodes} simulated
`hgx-h100` nodes, each a real `gpuplane-driver` (simulator backend) plus the e2e kubelet stand-in,
all on this machine. Per round: {args.pods} pods without claims in one `kubectl apply`, all Running,
deleted; then {args.pods} pods with {claim}. Latency per pod = start of `kubectl apply` until a watch
sees it Running; {rounds} round(s), all pods pooled.

| pods | p50 (s) | p99 (s) | max (s) | mean (s) |
|---|---|---|---|---|
| without claims | {plain["p50"]:.2f} | {plain["p99"]:.2f} | {plain["max"]:.2f} | {plain["mean"]:.2f} |
| with a GPU claim | {dra["p50"]:.2f} | {dra["p99"]:.2f} | {dra["max"]:.2f} | {dra["mean"]:.2f} |
| ratio (DRA overhead) | {ratio["p50"]:.2f}x | {ratio["p99"]:.2f}x | {ratio["max"]:.2f}x | |

Target ≤ 1.5x: {verdict} it. The claim path adds a ResourceClaim per pod (resourceclaim
controller), the scheduler's DRA allocator over {args.nodes}x208 published devices with MIG
counters, the stand-in's claim checks and `NodePrepareResources` (the driver creates the MIG
instance in the simulator or starts an MPS daemon, writes the CDI spec and its checkpoint).
Everything shares the same CPUs, so the absolute numbers say more about this machine than
about a cluster; the ratio is the figure to watch.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--pods", type=int, default=100)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--claims", choices=["mig", "mps", "timeslice"], default="mig")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--state-dir", type=Path, help="default: a temporary directory, removed afterwards")
    p.add_argument("--write", type=Path, help="append the result as a Markdown section to this file")
    p.add_argument(
        "--api-qps",
        type=int,
        default=None,
        help="client QPS of kube-scheduler and kube-controller-manager (burst 2x); default: upstream defaults",
    )
    p.add_argument(
        "--stages",
        action="store_true",
        help="also break each pod's time into stages (claim created, allocated, bound, Running; node side)",
    )
    args = p.parse_args(argv)
    say: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    bins = build.ensure_binaries(out=say)
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as tmp:
        state_dir = (args.state_dir or Path(tmp)).resolve()
        plane = controlplane.ControlPlane(
            state_dir, bins, die_with_parent=True, client_qps=args.api_qps, out=lambda _: None
        )
        say("starting the control plane ...")
        kubeconfig = plane.start()
        sim = simnodes.SimNodes(state_dir, kubeconfig, die_with_parent=True, out=lambda _: None)
        handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
        try:
            say(f"starting {args.nodes} simulated hgx-h100 nodes ...")
            sim.start([nodes.NodeGroup("hgx-h100", args.nodes)])
            handle.kubectl("apply", "-f", str(REPO_ROOT / "manifests" / "deviceclasses"))
            handle.kubectl("create", "namespace", NAMESPACE)
            handle.apply(claim_template(args.claims))
            wait(
                lambda: bool(
                    json.loads(handle.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, "-o", "json"))
                ),
                60,
                "default service account",
            )
            say("warm-up round (10 + 10 pods) ...")
            run_round(handle, "warm-plain", 10, False, args.timeout)
            run_round(handle, "warm-dra", 10, True, args.timeout)
            plain: list[float] = []
            dra: list[float] = []
            stages_plain: Stages | None = {} if args.stages else None
            stages_dra: Stages | None = {} if args.stages else None
            prepare = (0.0, 0.0)
            waits: collections.Counter[str] = collections.Counter()
            cpu_plain: dict[str, float] | None = {} if args.stages else None
            cpu_dra: dict[str, float] | None = {} if args.stages else None
            for r in range(args.rounds):
                say(f"round {r + 1}/{args.rounds}: {args.pods} pods without claims ...")
                plain += run_round(
                    handle, f"plain-{r}", args.pods, False, args.timeout, stages=stages_plain, sim=sim, cpu=cpu_plain
                )
                say(f"  p50 {percentile(plain[-args.pods :], 0.5):.2f}s, max {max(plain[-args.pods :]):.2f}s")
                say(f"round {r + 1}/{args.rounds}: {args.pods} pods with a {args.claims} claim ...")
                before = driver_prepare_metrics(sim) if args.stages else {}
                dra += run_round(
                    handle,
                    f"dra-{r}",
                    args.pods,
                    True,
                    args.timeout,
                    stages=stages_dra,
                    sim=sim,
                    waits=waits,
                    cpu=cpu_dra,
                )
                if args.stages:
                    after = driver_prepare_metrics(sim)
                    prepare = (
                        prepare[0] + sum(after[n][0] - before.get(n, (0.0, 0.0))[0] for n in after),
                        prepare[1] + sum(after[n][1] - before.get(n, (0.0, 0.0))[1] for n in after),
                    )
                say(f"  p50 {percentile(dra[-args.pods :], 0.5):.2f}s, max {max(dra[-args.pods :]):.2f}s")
        finally:
            handle.close()
            sim.stop()
            plane.stop()
    s_plain, s_dra = summary(plain), summary(dra)
    say(f"{'':16} {'p50':>7} {'p99':>7} {'max':>7} {'mean':>7}")
    for label, s in (("without claims", s_plain), ("with a claim", s_dra)):
        say(f"{label:16} {s['p50']:7.2f} {s['p99']:7.2f} {s['max']:7.2f} {s['mean']:7.2f}")
    say(
        f"{'ratio':16} {s_dra['p50'] / s_plain['p50']:6.2f}x {s_dra['p99'] / s_plain['p99']:6.2f}x "
        f"{s_dra['max'] / s_plain['max']:6.2f}x"
    )
    table = ""
    if stages_plain is not None and stages_dra is not None:
        table = stage_table(stages_plain, stages_dra, prepare)
        say("\nper-pod stages (watch arrival times in this process; stand-in lines from the kubelet logs):")
        say(table)
        say("why the stand-in's first start attempt waited (claim pods): " + json.dumps(dict(waits)))
        if cpu_plain is not None and cpu_dra is not None:
            table += "\n" + cpu_table(cpu_plain, cpu_dra)
            say("\nCPU seconds from the apply to the last pod Running, all measured rounds:")
            say(cpu_table(cpu_plain, cpu_dra))
    if args.write:
        with args.write.open("a") as f:
            f.write(markdown(args, s_plain, s_dra, args.rounds))
            if table:
                f.write("\nPer-pod stages (`--stages`):\n\n" + table)
        say(f"appended the result to {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
