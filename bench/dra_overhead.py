"""DRA overhead: apply-to-Running for pods with GPU claims next to the same pods without claims.

    python bench/dra_overhead.py [--pods 100] [--nodes 8] [--claims mig|mps|timeslice] [--rounds 1]
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
import contextlib
import datetime
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from e2e.cluster import build, controlplane, procs  # noqa: E402
from e2e.cluster import handle as cluster  # noqa: E402
from e2e.plane import kubelet_dra, kubelet_pods, nodes, simnodes  # noqa: E402

NAMESPACE = "dra-overhead"
PAUSE = "registry.k8s.io/pause:3.10"


def claim_template(kind: str) -> dict[str, Any]:
    """The ResourceClaimTemplate every claim pod uses."""
    if kind == "mig":
        exactly: dict[str, Any] = {
            "deviceClassName": "mig.gpuplane.dev",
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"'}}],
        }
    elif kind == "timeslice":
        exactly = {"deviceClassName": "gpu.gpuplane.dev", "capacity": {"requests": {"sharePercent": "50"}}}
    else:
        exactly = {"deviceClassName": "mps-bronze.gpu.gpuplane.dev", "capacity": {"requests": {"sharePercent": "50"}}}
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if kind == "timeslice":
        devices["config"] = [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {
                        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}},
                    },
                }
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": NAMESPACE},
        "spec": {"spec": {"devices": devices}},
    }


def pod(name: str, round_label: str, with_claim: bool) -> dict[str, Any]:
    """One benchmark pod."""
    container: dict[str, Any] = {"name": "c", "image": PAUSE}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if with_claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench-round": round_label}},
        "spec": spec,
    }


class _Watch:
    """One list+watch of a namespaced collection in a thread; ``_event`` sees every event (monotonic arrival)."""

    def __init__(self, list_call: Callable[..., Any]) -> None:
        self._list = list_call
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Start watching; returns once the watch is established."""
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()

    def _event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as err:  # the control plane going away at the end of the run, or a broken round
            if not self._stop.is_set():
                print(f"watch failed: {err}", file=sys.stderr, flush=True)

    def _follow(self) -> None:
        listed: Any = self._list(_preload_content=False)
        version = json.loads(listed.data)["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            response: Any = self._list(watch=True, resource_version=version, timeout_seconds=30, _preload_content=False)
            self._ready.set()
            for line in kubelet_pods.stream_lines(response):
                now = time.monotonic()
                event = json.loads(line)
                obj = event["object"]
                version = obj["metadata"].get("resourceVersion", version)
                self._event(event["type"], obj, now)
                if self._stop.is_set():
                    break
            response.release_conn()


class RunningWatch(_Watch):
    """When each pod of a round is first seen bound, with claim statuses, Running (monotonic clock)."""

    def __init__(self, api: client.ApiClient, round_label: str) -> None:
        core = client.CoreV1Api(api)
        selector = f"bench-round={round_label}"
        super().__init__(lambda **kw: core.list_namespaced_pod(NAMESPACE, label_selector=selector, **kw))
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.claim_status: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.gone: set[str] = set()

    def _event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"].get("name")
        if kind == "DELETED":
            self.gone.add(name)
            return
        status = obj.get("status") or {}
        self.created.setdefault(name, now)
        if (obj.get("spec") or {}).get("nodeName"):
            self.bound.setdefault(name, now)
        if status.get("resourceClaimStatuses"):
            self.claim_status.setdefault(name, now)
        if status.get("phase") == "Running":
            self.running.setdefault(name, now)


class ClaimWatch(_Watch):
    """When each pod's generated ResourceClaim is first seen (created), allocated, reserved (monotonic clock)."""

    def __init__(self, api: client.ApiClient) -> None:
        custom = client.CustomObjectsApi(api)
        super().__init__(
            lambda **kw: custom.list_namespaced_custom_object(
                kubelet_dra.GROUP, kubelet_dra.VERSION, NAMESPACE, "resourceclaims", **kw
            )
        )
        self.created: dict[str, float] = {}  # keyed by the owning pod's name
        self.allocated: dict[str, float] = {}
        self.reserved: dict[str, float] = {}

    def _event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        owners = [o["name"] for o in obj["metadata"].get("ownerReferences") or [] if o.get("kind") == "Pod"]
        if not owners:
            return
        pod_name = owners[0]
        self.created.setdefault(pod_name, now)
        status = obj.get("status") or {}
        if status.get("allocation"):
            self.allocated.setdefault(pod_name, now)
        if status.get("reservedFor"):
            self.reserved.setdefault(pod_name, now)


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll until ``predicate``; raise after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


Stages = dict[str, list[float]]
"""Stage name -> one duration (s) per pod, pooled over rounds."""

NODE_LINE = re.compile(
    r"pod (?P<ns>[^/\s]+)/(?P<name>\S+) running: total_ms=(?P<total>[\d.]+) wait_ms=(?P<wait>[\d.]+) "
    r"tries=(?P<tries>\d+) claims_ms=(?P<claims>[\d.]+) prepare_ms=(?P<prepare>[\d.]+) status_ms=(?P<status>[\d.]+)"
    r"(?: first_wait=(?P<why>.*))?"
)
NODE_FIELDS = {
    "wait": "stand-in: bound seen -> claims ready (poll)",
    "claims": "stand-in: claim reads (GET)",
    "prepare": "stand-in: NodePrepareResources call",
    "status": "stand-in: Running status write",
    "total": "stand-in: bound seen -> Running written",
}


def node_lines(
    sim: simnodes.SimNodes, names: Sequence[str], waits: collections.Counter[str], timeout: float = 10.0
) -> dict[str, dict[str, float]]:
    """The stand-ins' per-pod timing lines (ms) for ``names``, from the kubelet logs.

    Counts in ``waits`` why a first start attempt found a pod not ready (claim names left out).
    """
    wanted = set(names)
    found: dict[str, dict[str, float]] = {}
    why: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        for node in sim.started:
            with contextlib.suppress(OSError):
                for line in sim.log(node.kubelet_process).read_text(errors="replace").splitlines():
                    m = NODE_LINE.search(line)
                    if m and m["ns"] == NAMESPACE and m["name"] in wanted:
                        found[m["name"]] = {k: float(m[k]) for k in (*NODE_FIELDS, "tries")}
                        reason = (m["why"] or "''").strip("'\"")
                        why[m["name"]] = re.sub(r"claim \S+", "claim", reason) or "(none: started at once)"
        if len(found) == len(wanted) or time.monotonic() > deadline:
            waits.update(why.values())
            return found
        time.sleep(0.2)


def driver_prepare_metrics(sim: simnodes.SimNodes) -> dict[str, tuple[float, float]]:
    """Per node: (sum, count) of ``gpuplane_driver_rpc_duration_seconds{op="prepare"}`` from its /metrics."""
    out: dict[str, tuple[float, float]] = {}
    for node in sim.started:
        total = count = 0.0
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as response:
                text = response.read().decode()
            for line in text.splitlines():
                if line.startswith("gpuplane_driver_rpc_duration_seconds_sum{") and 'op="prepare"' in line:
                    total = float(line.rsplit(" ", 1)[1])
                elif line.startswith("gpuplane_driver_rpc_duration_seconds_count{") and 'op="prepare"' in line:
                    count = float(line.rsplit(" ", 1)[1])
        out[node.name] = (total, count)
    return out


def cpu_seconds(state_dir: Path) -> dict[str, float]:
    """CPU seconds (user + system) so far per component group, and ``machine busy`` over all CPUs (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, record in procs.read_records(state_dir / "pids").items():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{record.pid}/stat").read_text().rsplit(")", 1)[1].split()
            group = name.split("-hgx")[0] if "-hgx" in name else name  # driver-<node>, kubelet-<node>: summed
            out[group] = out.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    own = os.times()
    out["bench + kubectl"] = own.user + own.system + own.children_user + own.children_system
    with contextlib.suppress(OSError, ValueError):
        jiffies = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        out["machine busy"] = (sum(jiffies) - jiffies[3] - jiffies[4]) / tick  # all but idle and iowait
    return out


def add_cpu(total: dict[str, float], before: Mapping[str, float], after: Mapping[str, float]) -> None:
    """Add the CPU seconds spent between two ``cpu_seconds`` samples to ``total``."""
    for key, value in after.items():
        total[key] = total.get(key, 0.0) + value - before.get(key, 0.0)


def collect_stages(
    stages: Stages,
    started: float,
    names: Sequence[str],
    *,
    pods: RunningWatch,
    claims: ClaimWatch | None,
    node: Mapping[str, Mapping[str, float]],
) -> None:
    """Add each pod's stage durations (s) to ``stages``; a stage with a missing timestamp is skipped."""

    def add(stage: str, end: Mapping[str, float], begin: Mapping[str, float] | float) -> None:
        for n in names:
            t0 = begin if isinstance(begin, float) else begin.get(n)
            t1 = end.get(n)
            if t0 is not None and t1 is not None:
                stages.setdefault(stage, []).append(t1 - t0)

    add("apply -> pod created (kubectl, one pod at a time)", pods.created, started)
    if claims is None:
        add("pod created -> bound (scheduler)", pods.bound, pods.created)
        add("apply -> bound", pods.bound, started)
    else:
        add("pod created -> claim created (KCM)", claims.created, pods.created)
        add("claim created -> pod claim status (KCM)", pods.claim_status, claims.created)
        add("claim created -> allocated (scheduler)", claims.allocated, claims.created)
        add("pod claim status -> allocated (scheduler)", claims.allocated, pods.claim_status)
        add("allocated -> bound (scheduler)", pods.bound, claims.allocated)
        add("apply -> bound", pods.bound, started)
    add("bound -> Running (node side)", pods.running, pods.bound)
    add("apply -> Running", pods.running, started)
    for n in names:
        for key, stage in NODE_FIELDS.items():
            if n in node:
                stages.setdefault(stage, []).append(node[n][key] / 1000)
        if n in node:
            stages.setdefault("stand-in: start attempts", []).append(node[n]["tries"])


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


def cpu_table(plain: Mapping[str, float], dra: Mapping[str, float]) -> str:
    """CPU seconds per component during the rounds, as a Markdown table."""
    keys = sorted(set(plain) | set(dra), key=lambda k: (k.startswith(("wall", "machine")), -dra.get(k, 0.0)))
    rows = ["| component | CPU s, without claims | CPU s, with a claim |", "|---|---|---|"]
    rows += [f"| {k} | {plain.get(k, 0.0):.2f} | {dra.get(k, 0.0):.2f} |" for k in keys]
    return "\n".join(rows) + "\n"


def stage_table(plain: Stages, dra: Stages, prepare: tuple[float, float]) -> str:
    """The stage breakdown as a Markdown table (also printed)."""
    rows = ["| pods | stage | n | p50 (ms) | p99 (ms) | max (ms) | mean (ms) |", "|---|---|---|---|---|---|---|"]
    for kind, stages in (("without claims", plain), ("with a claim", dra)):
        for stage, values in stages.items():
            if stage == "stand-in: start attempts":
                rows.append(
                    f"| {kind} | {stage} | {len(values)} | {percentile(values, 50):.0f} | "
                    f"{percentile(values, 99):.0f} | {max(values):.0f} | {statistics.fmean(values):.2f} |"
                )
                continue
            ms = [v * 1000 for v in values]
            rows.append(
                f"| {kind} | {stage} | {len(ms)} | {percentile(ms, 50):.0f} | {percentile(ms, 99):.0f} | "
                f"{max(ms):.0f} | {statistics.fmean(ms):.0f} |"
            )
    total, count = prepare
    if count:
        rows.append(
            f"| with a claim | driver: NodePrepareResources (metrics sum/count, all nodes) | {count:.0f} | | | | "
            f"{total / count * 1000:.1f} |"
        )
    return "\n".join(rows) + "\n"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50, p99, max, mean."""
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def markdown(args: argparse.Namespace, plain: dict[str, float], dra: dict[str, float], rounds: int) -> str:
    """The section appended to the benchmarks file."""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    claim = {
        "mig": "one `1g.10gb` MIG device per pod (ResourceClaimTemplate, class `mig.gpuplane.dev`)",
        "mps": "a 50 % MPS share per pod (class `mps-bronze.gpu.gpuplane.dev`, `sharePercent: 50`)",
        "timeslice": "a 50 % time-sliced share of a whole GPU per pod (class `gpu.gpuplane.dev`, "
        "`sharePercent: 50`, `TimeSlicing` config)",
    }[args.claims]
    ratio = {k: dra[k] / plain[k] for k in ("p50", "p99", "max")}
    verdict = "meets" if ratio["p50"] <= 1.5 and ratio["p99"] <= 1.5 else "misses"
    return f"""
## DRA overhead: apply-to-Running, {args.pods} pods with and without GPU claims ({datetime.date.today()})

`python bench/dra_overhead.py --pods {args.pods} --nodes {args.nodes} --claims {args.claims} --rounds {rounds}`
on {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}: a loopback control plane
(etcd, kube-apiserver, kube-scheduler, kube-controller-manager v1.36.3) and {args.nodes} simulated
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
                say(f"  p50 {percentile(plain[-args.pods :], 50):.2f}s, max {max(plain[-args.pods :]):.2f}s")
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
                say(f"  p50 {percentile(dra[-args.pods :], 50):.2f}s, max {max(dra[-args.pods :]):.2f}s")
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
