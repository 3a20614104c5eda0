"""Upstream gang scheduling vs gpuplane: which NVLink domain each gang gets, on the same gang sequence, in one run.

    python -m bench gang_domains [--trials 1] [--write docs/placement.md] [--state-dir DIR]

Brings up a real control plane with simulated GPU nodes: two HGX H100 boards
(one 8-GPU NVLink domain each) and four GB200 trays in two racks of two (two
8-GPU domains of two nodes), 32 GPUs in four domains, and one gpuplane-controller.
Then plays each scenario of ``SCENARIOS`` (:mod:`bench.gangs.gang_objects`; gangs arriving and leaving; each
gang is ``members x GPUs per member`` and must sit in one NVLink domain) once per
way of writing it, from an empty cluster each time:

* **upstream**: a Workload and a PodGroup per gang (gang policy ``minCount`` =
  members, topology constraint on the node label ``gpuplane.dev/nvlink-domain``),
  pods pointing at the PodGroup through ``spec.schedulingGroup`` with claims from
  a ResourceClaimTemplate. kube-scheduler alone picks the domain and the nodes
  (its GangScheduling, TopologyPlacementGenerator and PlacementScore plugins);
  no gpuplane code is on the decision path (the controller only keeps the node
  labels);
* **steered**: the same Workload, PodGroup and pods, plus a GpuGang of the same
  shape and, in the pods, the gang label, a member index and gpuplane's gate:
  gpuplane-controller picks domain and nodes and narrows each gated pod's node
  affinity; kube-scheduler still schedules the PodGroup all or nothing;
* **gpuplane**: a GpuGang per gang and the same pods without a PodGroup.

After every step it waits until nothing changes, then records, per API, where
the gang went and the cluster's largest free blocks (free GPUs on one node and
in one NVLink domain), and at the end: gangs placed, gangs waiting, domain
crossings (a gang whose GPUs span two domains), largest free blocks. Every pod
requests 1 CPU and 16 GiB per GPU, so the scheduler's resource scoring sees the
same load as the GPUs. The upstream choice between equal placements is random
(kube-scheduler breaks ties by a random number), so ``--trials`` repeats it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.gangs.gang_objects import SCENARIOS, Steps, claim_template, gang_objects
from e2e.cluster import build, controlplane
from e2e.cluster import handle as cluster
from e2e.plane import components, nodes, simnodes
from gpuplane.controller import names

NODE_SPEC = "hgx-h100:2,gb200-nvl72:4"
RACK_NODES = 2
SETTLE_S = 4.0
STEP_TIMEOUT_S = 90.0


@dataclasses.dataclass
class Gang:
    """Where a gang's pods and GPUs are."""

    name: str
    members: int
    pods_bound: int = 0
    nodes: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()

    @property
    def placed(self) -> bool:
        return self.pods_bound == self.members


@dataclasses.dataclass
class Step:
    """The state after one step of the sequence."""

    event: str
    gangs: dict[str, Gang]
    free_node: int
    free_domain: int
    free: int


class Observer:
    """Reads where the gangs of one namespace are, and the free GPU blocks of the cluster."""

    def __init__(self, handle: cluster.Cluster, ns: str) -> None:
        self.handle = handle
        self.ns = ns
        self.domain_of: dict[tuple[str, str], str] = {}
        self.gpus_of_node: dict[str, int] = {}
        self.domain_nodes: dict[str, set[str]] = {}

    def _json(self, *args: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.handle.kubectl(*args, "-o", "json", timeout=120))
        return data

    def load_devices(self) -> None:
        for s in self._json("get", "resourceslices")["items"]:
            spec = s["spec"]
            for d in spec.get("devices") or []:
                attrs = d.get("attributes") or {}
                kind = (attrs.get("type") or attrs.get("gpu.gpuplane.dev/type") or {}).get("string")
                if kind != "gpu":
                    continue
                raw = attrs.get("nvlinkDomain") or attrs.get("gpu.gpuplane.dev/nvlinkDomain") or {}
                domain = str(raw.get("string"))
                self.domain_of[(spec["pool"]["name"], d["name"])] = domain
                self.gpus_of_node[spec["nodeName"]] = self.gpus_of_node.get(spec["nodeName"], 0) + 1
                self.domain_nodes.setdefault(domain, set()).add(spec["nodeName"])

    def short(self, domain: str) -> str:
        return "+".join(sorted(self.domain_nodes.get(domain, {domain})))

    def state(self, wanted: Mapping[str, int]) -> tuple[dict[str, Gang], int, int, int]:
        pods = self._json("get", "pods", "-n", self.ns)["items"]
        claims = {c["metadata"]["name"]: c for c in self._json("get", "resourceclaims", "-A")["items"]}
        gangs = {g: Gang(g, m) for g, m in wanted.items()}
        for pod in pods:
            gang = gangs.get(pod["metadata"]["labels"].get("bench/gang", ""))
            if gang is None or not pod["spec"].get("nodeName") or pod["status"].get("phase") != "Running":
                continue
            gang.pods_bound += 1
            gang.nodes = tuple(sorted({*gang.nodes, pod["spec"]["nodeName"]}))
            for st in pod["status"].get("resourceClaimStatuses") or []:
                claim = claims.get(st.get("resourceClaimName") or "")
                for r in (
                    (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
                ):
                    gang.domains = tuple(sorted({*gang.domains, self.domain_of.get((r["pool"], r["device"]), "?")}))
        used: dict[str, int] = {}
        for c in claims.values():
            for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
                if (r["pool"], r["device"]) in self.domain_of:
                    used[r["pool"]] = used.get(r["pool"], 0) + 1
        free_node = {n: total - used.get(n, 0) for n, total in self.gpus_of_node.items()}
        free_domain = {d: sum(free_node[n] for n in ns_) for d, ns_ in self.domain_nodes.items()}
        return gangs, max(free_node.values()), max(free_domain.values()), sum(free_node.values())


def settle(observer: Observer, wanted: Mapping[str, int], out: Callable[[str], None]) -> Step:
    """Wait until the namespace stops changing (and every running gang is whole), return its state."""
    began = time.monotonic()
    last: str = ""
    since = time.monotonic()
    while True:
        gangs, free_node, free_domain, free = observer.state(wanted)
        key = json.dumps({g: dataclasses.asdict(v) for g, v in gangs.items()}, sort_keys=True)
        now = time.monotonic()
        if key != last:
            last, since = key, now
        partial = [g for g in gangs.values() if 0 < g.pods_bound < g.members]
        if not partial and now - since >= SETTLE_S:
            return Step("", gangs, free_node, free_domain, free)
        if now - began > STEP_TIMEOUT_S:
            out(f"  (not settled after {STEP_TIMEOUT_S:.0f}s; partial gangs: {[g.name for g in partial]})")
            return Step("", gangs, free_node, free_domain, free)
        time.sleep(0.5)


def play(handle: cluster.Cluster, api: str, ns: str, sequence: Steps, out: Callable[[str], None]) -> list[Step]:
    """Apply the sequence in ``api``'s terms; the state after every step."""
    handle.kubectl("create", "namespace", ns)
    handle.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all([claim_template(ns, g) for g in (2, 4, 8)]))
    observer = Observer(handle, ns)
    observer.load_devices()
    wanted: dict[str, int] = {}
    steps: list[Step] = []
    for action, gang, members, gpus in sequence:
        if action == "arrive":
            wanted[gang] = members
            handle.kubectl(
                "apply", "-f", "-", input_text=yaml.safe_dump_all(gang_objects(ns, gang, members, gpus, api))
            )
            event = f"+{gang} {members}x{gpus}"
        else:
            handle.kubectl("delete", "pods", "-n", ns, "-l", f"bench/gang={gang}", "--wait=true", timeout=120)
            if api in ("gpuplane", "steered"):
                handle.kubectl("delete", "gpugang", "-n", ns, gang, "--ignore-not-found", "--wait=true", timeout=120)
            if api in ("upstream", "steered"):
                handle.kubectl("delete", "podgroup,workload", "-n", ns, gang, "--ignore-not-found", timeout=120)
            wanted.pop(gang)
            event = f"-{gang}"
        step = settle(observer, wanted, out)
        step.event = event
        steps.append(step)
        where = step.gangs.get(gang)
        placed = f"{observer.short(where.domains[0])}" if where and where.placed and where.domains else "-"
        out(f"  {api:8} {event:10} -> {placed:28} free: node {step.free_node}, domain {step.free_domain}")
    handle.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s", timeout=200)
    return steps


def summary(steps: list[Step], sequence: Steps) -> dict[str, Any]:
    """Final figures of one run."""
    final = steps[-1]
    arrived = sum(1 for s in sequence if s[0] == "arrive")
    ever = {g for s in steps for g, v in s.gangs.items() if v.placed}
    return {
        "placed_now": sum(1 for g in final.gangs.values() if g.placed),
        "waiting_now": sum(1 for g in final.gangs.values() if not g.placed),
        "ever_placed": len(ever),
        "arrived": arrived,
        "crossings": sum(1 for s in steps for g in s.gangs.values() if len(g.domains) > 1),
        "free_node": final.free_node,
        "free_domain": final.free_domain,
        "free": final.free,
    }


def markdown(runs: Mapping[str, list[list[Step]]], sequence: Steps, observer_short: Callable[[str], str]) -> str:
    """Side-by-side tables: where each gang went, and the final figures."""
    apis = list(runs)
    lines = ["| step | " + " | ".join(f"{a} (trial {t + 1})" for a in apis for t in range(len(runs[a]))) + " |"]
    lines.append("|---|" + "---|" * sum(len(v) for v in runs.values()))
    for i, (action, gang, _m, _g) in enumerate(sequence):
        cells = []
        for a in apis:
            for trial in runs[a]:
                step = trial[i]
                g = step.gangs.get(gang)
                if action == "leave":
                    where = "left"
                elif g is None or not g.placed:
                    where = "waits"
                else:
                    where = ", ".join(observer_short(d) for d in g.domains) + f" ({'/'.join(g.nodes)})"
                cells.append(f"{where}; free {step.free_node}/{step.free_domain}")
        lines.append(f"| {steps_label(sequence, i)} | " + " | ".join(cells) + " |")
    lines += ["", "| figure | " + " | ".join(f"{a} (trial {t + 1})" for a in apis for t in range(len(runs[a]))) + " |"]
    lines.append("|---|" + "---|" * sum(len(v) for v in runs.values()))
    sums = [summary(trial, sequence) for a in apis for trial in runs[a]]
    for label, key in (
        ("gangs placed at the end", "placed_now"),
        ("gangs waiting at the end", "waiting_now"),
        (f"gangs ever placed (of {sums[0]['arrived']})", "ever_placed"),
        ("domain crossings", "crossings"),
        ("largest free block on one node (GPUs)", "free_node"),
        ("largest free block in one NVLink domain (GPUs)", "free_domain"),
        ("free GPUs", "free"),
    ):
        lines.append(f"| {label} | " + " | ".join(str(s[key]) for s in sums) + " |")
    return "\n".join(lines)


def steps_label(sequence: Steps, i: int) -> str:
    action, gang, members, gpus = sequence[i]
    return f"{i + 1}. {'+' if action == 'arrive' else '-'}{gang}" + (f" {members}x{gpus}" if action == "arrive" else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Bring the cluster up, play the sequence per API, print (and optionally append) the tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--trials", type=int, default=1, help="upstream runs (its tie-break is random)")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: all")
    p.add_argument("--state-dir", type=Path, help="default: a temporary directory, removed afterwards")
    p.add_argument("--write", type=Path, help="append the result as a Markdown section to this file")
    args = p.parse_args(argv)
    out: Callable[[str], None] = lambda s: print(s, flush=True)  # noqa: E731
    tmp = None if args.state_dir else tempfile.TemporaryDirectory(prefix="gang-domains-")
    state_dir = Path(args.state_dir or (tmp.name if tmp else ".")).resolve()
    bins = build.ensure_binaries(out=out)
    plane = controlplane.ControlPlane(state_dir, bins, die_with_parent=True, out=lambda _: None)
    kubeconfig = plane.start()
    handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
    sim = None
    ctl = None
    try:
        components.install(handle, out=lambda _: None)
        creds = components.driver_credentials(handle, components.identities_dir(state_dir))
        sim = simnodes.SimNodes(
            state_dir,
            kubeconfig,
            driver_credentials=creds,
            die_with_parent=True,
            rack_nodes=RACK_NODES,
            out=lambda _: None,
        )
        sim.start(nodes.parse_node_spec(NODE_SPEC))
        ctl = components.Controllers(state_dir, handle, replicas=1, die_with_parent=True, out=lambda _: None)
        ctl.start()
        deadline = time.monotonic() + 60
        while True:  # the controller labels every node with its NVLink domain (the upstream topology key)
            listed = json.loads(handle.kubectl("get", "nodes", "-o", "json"))["items"]
            if all(names.NODE_LABEL_NVLINK_DOMAIN in (n["metadata"].get("labels") or {}) for n in listed):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("nodes did not get their NVLink-domain labels")
            time.sleep(0.5)
        out(f"cluster: {NODE_SPEC} (GB200 racks of {RACK_NODES} trays): 4 NVLink domains x 8 GPUs")
        observer = Observer(handle, "default")
        observer.load_devices()
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        for scenario in args.scenario or sorted(SCENARIOS):
            sequence = SCENARIOS[scenario]
            out(f"scenario {scenario}")
            runs: dict[str, list[list[Step]]] = {"upstream": [], "steered": [], "gpuplane": []}
            for trial in range(args.trials):
                runs["upstream"].append(play(handle, "upstream", f"bench-upstream-{scenario}-{trial}", sequence, out))
            for api in ("steered", "gpuplane"):
                runs[api].append(play(handle, api, f"bench-{api}-{scenario}", sequence, out))
            table = markdown(runs, sequence, observer.short)
            print(f"\nscenario {scenario}\n{table}\n", flush=True)
            if args.write:
                with args.write.open("a") as f:
                    cmd = f"python -m bench gang_domains --scenario {scenario} --trials {args.trials}"
                    f.write(f"\n#### `{cmd}` ({stamp})\n\n{table}\n")
    finally:
        if ctl is not None:
            ctl.stop()
        if sim is not None:
            sim.stop()
        handle.close()
        plane.stop()
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
