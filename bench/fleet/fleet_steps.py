"""Fleet benchmark: the state of one run and its steps (``bench.fleet.fleet_scale`` runs them in order).

``Run`` holds the cluster, the fleet's publishers, the probes and everything measured; each step
function is one part of the three measurements, and the before/after passes: the scheduler on the
slice layout before counter sets were packed (a0), and the health passes with every change
rewriting the pool, as the publisher did before.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.fleet import (
    fleet_api,
    fleet_before,
    fleet_controller,
    fleet_offer,
    fleet_probe,
    fleet_profile,
    fleet_sched,
    sched_pprof,
)
from e2e.cluster import handle as cluster
from e2e.cluster import procs
from e2e.plane import components, fleet, fleetslices

RSS_TARGET_MB = 200.0  # the controller at 1,000 nodes and 10,000 claims (issue 17)


def took(seconds: float, after: str = "", digits: int = 1) -> str:
    """ "in 12.3s" (or "12s after the start"), or "not within the timeout" for a step never reached (nan)."""
    if math.isnan(seconds):
        return "not within the timeout"
    return f"{seconds:.{digits}f}s {after}" if after else f"in {seconds:.{digits}f}s"


def others(probe: fleet_probe.Probe | None) -> str:
    """The busiest processes outside this benchmark, over 3 s."""
    mine = {os.getpid(), *(probe.pids().values() if probe else ())}
    top = fleet_probe.busiest(exclude=mine)
    return ", ".join(f"{name} {cpus:.2f}" for name, cpus in top) or "none above 0.02 CPUs"


@dataclasses.dataclass
class Run:
    """Everything one benchmark run holds and collects."""

    args: argparse.Namespace
    skip: set[str]
    api: Any
    handle: cluster.Cluster
    probe: fleet_probe.Probe
    peaks: fleet_probe.PeakSampler
    slices: fleetslices.FleetSlices
    nodes: tuple[fleet.FleetNode, ...]
    say: Callable[[str], None]
    report: list[str] = dataclasses.field(default_factory=list)
    rounds: list[fleet_sched.Round] = dataclasses.field(default_factory=list)
    passes: list[fleet_api.Republish] = dataclasses.field(default_factory=list)
    footprints: list[tuple[str, fleet_api.Footprint]] = dataclasses.field(default_factory=list)
    memory: list[tuple[str, dict[str, float]]] = dataclasses.field(default_factory=list)
    moments: list[fleet_controller.Moment] = dataclasses.field(default_factory=list)
    ctl_pid: int = 0
    over_target: list[str] = dataclasses.field(default_factory=list)  # the memory report taken past the target
    followers: fleet_before.Followers | None = None
    before_commit: str = ""
    newer_version: str = ""  # the report's line on the (a+) rounds' kube-scheduler ('' without them)
    profiler: sched_pprof.SchedulerProfiler | None = None  # --pprof: the (a) rounds' scheduler CPU profiles
    mig_offer: Any = None  # the MIG offer (a) is published under (node -> GPUs); None: every GPU's placements

    def section(self, title: str, body: str) -> None:
        """Print a report section and keep it for ``--write``."""
        self.say(f"\n### {title}\n\n{body}")
        self.report.append(f"\n### {title}\n\n{body}")

    def remember_memory(self, moment: str) -> None:
        """RSS of every component now."""
        self.memory.append((moment, fleet_api.memory(self.probe)))

    def round(self, variant: str, kind: str, pods: int, label: str) -> None:
        """One scheduler round (with ``--pprof``, kube-scheduler profiled through each (a) round)."""
        a = self.args
        self.say(f"round ({variant}): {pods} pods, {fleet_sched.KIND_TEXT[kind]} ...")
        profiler = self.profiler if variant == "a" else None
        with profiler.during(label) if profiler is not None else contextlib.nullcontext():
            self.rounds.append(
                fleet_sched.run_round(
                    self.api,
                    self.probe,
                    fleet_variant=variant,
                    kind=kind,
                    pods=pods,
                    label=label,
                    timeout=a.timeout,
                    workers=a.workers,
                    out=self.say,
                )
            )

    def moment(self, what: str, t0: float, cpu0: float, detail: str) -> None:
        """Record the controller at the end of a step."""
        name = f"{components.CONTROLLER_PREFIX}0"
        self.moments.append(
            fleet_controller.Moment(
                what,
                time.monotonic() - t0,
                fleet_probe.rss_mb(self.ctl_pid),
                self.peaks.peak(name),
                fleet_probe.cpu_s(self.ctl_pid) - cpu0,
                detail,
            )
        )
        self.peaks.reset(name)
        if self.followers is not None:
            self.followers.read(what, self.peaks)


def publish_first(run: Run) -> fleetslices.PublishPass:
    """Discovery and the first publish (a): under the controller's MIG offer (``--mig-offer controller``: the
    decision on the idle fleet with the (a) MIG round's claims waiting), or every GPU's placements (``all``)."""
    if run.args.mig_offer == "controller":
        run.slices.discover(mig_offer={})
        offer = fleet_offer.initial_offer(run.slices, run.args.pods_a or 0)
        run.mig_offer = offer.nodes
        labelled = fleet_offer.label_nodes(run.api, offer)
        run.say(f"MIG offer (a): {offer.gpu_count()} GPUs on {len(offer.nodes)} nodes ({labelled} labelled)")
        run.slices.discover(mig_offer=run.mig_offer, names_=sorted(offer.nodes))
    else:
        run.slices.discover()
    return run.slices.publish(what="publish (a): gpuplane's slices")


def scheduler_rounds_a(run: Run) -> None:
    """Measurement 1 on the slices as published: (c) pods without claims, then each claim kind on (a);
    then (a0), the same fleet in the layout before counter sets were packed (one counter slice per GPU)."""
    a = run.args
    for r in range(a.rounds):
        run.round("c", "none", a.pods, f"c-none-{r}")
        for kind in fleet_sched.KINDS[1:] if a.pods_a else ():
            run.round("a", kind, a.pods_a, f"a-{kind}-{r}")
    run.remember_memory("after rounds (a)")
    if run.mig_offer is not None and "offer" not in run.skip:
        figures = fleet_offer.offer_latency(
            run.api, run.slices, requests=a.offer_requests, streams=5, timeout=a.timeout, out=run.say
        )
        run.section("1. MIG offer: a request for a profile the fleet does not publish", figures)
        run.slices.discover(mig_offer=run.mig_offer)
        run.slices.publish(what="(a) under its MIG offer again")
    if not a.pods_a0:
        return
    run.say("republishing one counter slice per GPU (a0, the layout before packing) ...")
    run.slices.set_layout(counter_sets_per_slice=1)
    run.passes.append(
        fleet_api.republish(run.slices, run.api, run.probe, what="(a) -> (a0): counter sets unpacked", taints=_none)
    )
    run.footprints.append(
        ("(a0) before packing: one counter slice per GPU", fleet_api.slice_footprint(run.api, run.probe))
    )
    for r in range(a.rounds):
        for kind in fleet_sched.KINDS[1:]:
            run.round("a0", kind, a.pods_a0, f"a0-{kind}-{r}")
    run.slices.set_layout()
    run.passes.append(
        fleet_api.republish(run.slices, run.api, run.probe, what="(a0) -> (a): counter sets packed", taints=_none)
    )


NEWER_SCHEDULER_GATES = {"DRADeviceTaintRules": False}


def gates_text() -> str:
    """What the report says about the newer scheduler's gate overrides."""
    gates = ", ".join(f"{k}={str(v).lower()}" for k, v in NEWER_SCHEDULER_GATES.items())
    return f"{gates} (its DeviceTaintRule API version is newer than the 1.36 API server's; the fleet has none)"


def newer_scheduler_rounds(run: Run, state_dir: Path, binary: Path) -> None:
    """The (a) kinds again (rows a+) on ``binary``, swapped in for the cluster's kube-scheduler; then swapped back.

    Same fleet, same slices, same pods, minutes apart: the (a+)/(a) ratios are the newer allocator's
    effect alone. The scheduler's flags are the cluster's (DRA feature gates only, see
    ``fleet_probe.replace_scheduler``).
    """
    a = run.args
    original = Path(procs.read_records(state_dir / "pids")["kube-scheduler"].argv[0])
    # A 1.37 scheduler watches DeviceTaintRules at resource.k8s.io/v1, which a 1.36 API server does not
    # serve (v1beta2): its informers would never sync. The fleet has no DeviceTaintRule; slice taints stay on.
    _, version = fleet_probe.replace_scheduler(state_dir, binary, gates=NEWER_SCHEDULER_GATES)
    run.say(f"kube-scheduler swapped for {version} ({binary}) ...")
    run.newer_version = f" Rows a+: the (a) rounds again on {version} ({binary}), swapped in, with {gates_text()}."
    try:
        for r in range(a.rounds):
            for kind in fleet_sched.KINDS[1:] if a.pods_a else ():
                run.round("a+", kind, a.pods_a, f"an-{kind}-{r}")
    finally:
        fleet_probe.replace_scheduler(state_dir, original)
        run.say(f"kube-scheduler swapped back to {original}")
    run.remember_memory("after rounds (a+)")


def _none(_: str) -> dict[str, Any]:
    return {}


def to_whole_gpus(run: Run) -> None:
    """Republish every node as whole GPUs only (b); footprint; (b) rounds unless skipped."""
    run.say("republishing whole GPUs only (b) ...")
    run.slices.discover(mig_placements=False)
    run.passes.append(
        fleet_api.republish(run.slices, run.api, run.probe, what="(a) -> (b): whole GPUs only", taints=lambda _: {})
    )
    run.footprints.append(("(b) whole GPUs only", fleet_api.slice_footprint(run.api, run.probe)))
    if "sched" not in run.skip:
        for r in range(run.args.rounds):
            for kind in ("gpu-1", "gpu-4"):
                run.round("b", kind, run.args.pods, f"b-{kind}-{r}")
        run.remember_memory("after rounds (b)")


def background_claims(run: Run) -> str:
    """The controller's background claims, allocated while the fleet publishes (b); returns a detail line."""
    bg = fleet_controller.background(
        run.api,
        run.probe,
        run.args.claims,
        timeout=run.args.timeout,
        workers=run.args.workers,
        out=run.say,
        share_pods=run.args.share_pods,
    )
    bound = sum(r.bound for r in bg)
    span = sum(r.span_s for r in bg)
    rate = bound / max(span, 1e-9)
    podless = run.args.claims - sum(r.pods for r in bg)
    rest = f"; {podless} without a pod, pending" if podless else ""
    return f"{bound}/{run.args.claims} claims allocated, their pods Running{rest}; scheduler {rate:.1f} pods/s on (b)"


def back_to_partitionable(run: Run) -> None:
    """Republish every node with its MIG placements (a) again (under the MIG offer of (a), if any)."""
    run.slices.discover(mig_offer=run.mig_offer)
    run.passes.append(
        fleet_api.republish(run.slices, run.api, run.probe, what="(b) -> (a): MIG placements back", taints=lambda _: {})
    )


def health_passes(run: Run) -> None:
    """Measurement 2: one fleet-wide health change, its recovery, and a resync that changes nothing."""
    run.say("health change on every node (fatal Xid on gpu-3), then cleared ...")
    for what, taints in (
        ("health: Xid taint on gpu-3", fleet_api.xid_taints),
        ("health: taint cleared", lambda _: {}),
        ("unchanged (periodic resync)", lambda _: {}),
    ):
        run.passes.append(fleet_api.republish(run.slices, run.api, run.probe, what=what, taints=taints))
    if "publisher-before" in run.skip:
        return
    run.say("the same health change and recovery with every change rewriting the pool (the publisher before) ...")
    run.slices.set_layout(in_place=False)
    for what, taints in (
        ("before: Xid taint on gpu-3, pool rewritten", fleet_api.xid_taints),
        ("before: taint cleared, pool rewritten", lambda _: {}),
    ):
        run.passes.append(fleet_api.republish(run.slices, run.api, run.probe, what=what, taints=taints))
    run.slices.set_layout()


def start_followers(run: Run, before_tree: Any, state_dir: Any) -> None:
    """The before and after follower replicas (after the leader holds the Lease), once both are idle."""
    run.followers = fleet_before.start_followers(run.handle, state_dir, before_tree, run.say)
    run.followers.settle(run.args.timeout, run.say)
    run.followers.read("started on the fleet (a), indexes synced", run.peaks)


def report_when_over_target(run: Run) -> None:
    """Take the controller's memory report the first time its RSS passes :data:`RSS_TARGET_MB`.

    The report lists every live object, so the peaks after it include its own memory; the text
    says at what RSS it was asked and what the peak was before it.
    """
    pid, name = run.ctl_pid, f"{components.CONTROLLER_PREFIX}0"

    def report(rss: float) -> None:
        before = run.peaks.peak(name)
        run.say(f"  controller at {rss:.0f} MB, past the {RSS_TARGET_MB:.0f} MB target: taking its memory report ...")
        text = fleet_controller.memory_report(pid)
        run.over_target.append(
            f"Asked at {rss:.0f} MB RSS (step peak before it {before:.0f} MB); later peaks include the report's "
            f"own memory.\n\n```text\n{text}```"
        )

    run.peaks.when_above(name, RSS_TARGET_MB, report)


def post_mortem(run: Run) -> list[str]:
    """After a failed run: which components are gone (and whether the kernel's OOM killer took one), then the
    controller and memory tables measured so far."""
    lines = []
    pids = run.probe.pids()
    for name, pid in sorted(pids.items()):
        if not _alive(pid):
            lines.append(f"  component gone: {name} (pid {pid})")
    try:
        kernel = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        kernel = ""
    ours = {f"Killed process {pid} " for pid in pids.values()}  # this run's components, not an earlier run's
    lines += [f"  kernel: {k.strip()}" for k in kernel.splitlines() if any(o in k for o in ours)][-3:]
    if run.moments:
        lines += ["", "controller so far:", fleet_controller.moments_table(run.moments, RSS_TARGET_MB)]
    if run.memory:
        run.memory.append(("peak until the failure", dict(run.peaks.peaks)))
        lines += ["", "resident memory so far:", fleet_api.memory_table(run.memory)]
    lines += ["", "controller memory past the target:", *run.over_target] if run.over_target else []
    return lines


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def where_cpu_goes(run: Run, what: str, seconds: float = 30.0) -> None:
    """How busy the controller is now (``/proc``) and where its CPU goes (py-spy, ``seconds``)."""
    pid = run.ctl_pid
    t0, cpu0 = time.monotonic(), fleet_probe.cpu_s(pid)
    text = fleet_profile.summary(fleet_profile.start(pid, seconds))
    share = (fleet_probe.cpu_s(pid) - cpu0) / (time.monotonic() - t0)
    body = (
        f"CPU {100 * share:.0f} % of one core over {time.monotonic() - t0:.0f} s (from /proc)\n\n```text\n{text}\n```"
    )
    run.section(f"3. where the controller's CPU goes: {what}", body)


def restart(
    run: Run, ctl: Any, start: Callable[[], tuple[Any, int]], detail: str, *, timeout: float, profile_s: float = 150.0
) -> Any:
    """Stop the controller and start a new one with everything in place (an upgrade); how long until it is
    quiet, where its CPU went in its first ``profile_s``, and, if it never got quiet, where it goes then."""
    run.say("restarting the controller with the fleet, the claims, their pods and the gangs in place ...")
    if ctl is not None:
        ctl.stop()
    run.peaks.reset(f"{components.CONTROLLER_PREFIX}0")  # the new process's peak alone
    t0 = time.monotonic()
    ctl, run.ctl_pid = start()
    recording = fleet_profile.start(run.ctl_pid, min(timeout, profile_s))
    quiet = fleet_controller.settle(run.ctl_pid, timeout)
    first = fleet_profile.summary(recording)
    run.moment(
        "restarted with everything in place (an upgrade)",
        t0,
        0.0,
        f"settled (under 25 % of a CPU for 10 s) {took(quiet, 'after the start', 0)} (timeout {timeout:.0f} s); "
        + detail,
    )
    run.section(
        f"3. where the restarted controller's CPU went in its first {min(timeout, profile_s):.0f} s",
        f"```text\n{first}\n```",
    )
    if math.isnan(quiet):
        where_cpu_goes(run, f"restarted, still busy after {timeout:.0f} s")
    return ctl
