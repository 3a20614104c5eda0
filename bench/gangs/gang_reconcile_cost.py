"""What one gang reconcile costs the controller's event loop at fleet scale, before and after, in one run.

    python -m bench gang_reconcile_cost [--hgx 800] [--gb200 200] [--allocated 2800] [--pending 7200]
        [--gangs 100] [--repeat 5]

No API server: the indexes the controller would hold (slice digests of the driver's own slices, the
indexed form of each claim, member pods, gangs) are built in memory for a fleet like the fleet bench's
(``bench.fleet.fleet_scale``), and the controller's own functions run over them: ``gang.run.make_world``
(what every gang event and timer copies out of kopf's indexes), the queue pass (``gang.run.plan_for``
with nothing cached) and ``world.gpu_domains``, then ``reconciler.decide`` for a gang that holds its
placement, with the pass (as before ``68f8749``) and with the domains alone, cached while the slices stay
the same (after). Every gang
is reconciled once per ``resync_s`` (2 s) by its timer, so the last column says how much of one
CPU 100 such gangs would take.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuplane.api import kubetime
from gpuplane.controller import config, deviceclass, indexed, metrics, names, runtime
from gpuplane.controller.gang import placement_record, podview, queue_runner, reconciler, world
from gpuplane.controller.gang import run as gang_run
from gpuplane.controller.gang import view as gang_view
from gpuplane.controller.node import slice_index
from gpuplane.driver import inventory
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.publish import slices
from gpuplane.placement import model

CLUSTER = "6a1c4a2e-9a53-4a44-9a3c-3a1c4a2e9a53"
TRAYS_PER_RACK = 18  # GB200 NVL72: 18 trays of 4 GPUs
NS = "bench"
GB200 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"'


def _rendered(tmp: Path, node: str, profile: str, clique: int | None) -> str:
    cfg = SimConfig(
        profile=profile,
        state_dir=tmp / node,
        node_name=node,
        durable=False,
        cluster_uuid=CLUSTER if clique is not None else None,
        clique_id=clique,
    )
    (tmp / node).mkdir(parents=True, exist_ok=True)
    with Simulator(cfg) as sim:
        inv = inventory.discover(node, sim)
    return json.dumps(slices.render_slices(slices.build_pool(inv), 1))


def fleet(hgx: int, gb200: int) -> tuple[list[slice_index.SliceDigest], list[str], list[str]]:
    """The slice digests of ``hgx`` HGX H100 nodes and ``gb200`` GB200 trays (racks of 18), as indexed."""
    with tempfile.TemporaryDirectory() as tmp:
        hgx_t = _rendered(Path(tmp), "tmpl-hgx", "hgx-h100", None)
        racks = {r: _rendered(Path(tmp), f"tmpl-nvl{r}", "gb200-nvl72", r) for r in range((gb200 + 17) // 18)}
    out: list[slice_index.SliceDigest] = []
    hgx_nodes = [f"hgx-{i}" for i in range(hgx)]
    nvl_nodes = [f"nvl-{i}" for i in range(gb200)]
    for node in hgx_nodes:
        out += [d for s in json.loads(hgx_t.replace("tmpl-hgx", node)) if (d := slice_index.as_digest(s))]
    for i, node in enumerate(nvl_nodes):
        r = i // TRAYS_PER_RACK
        out += [d for s in json.loads(racks[r].replace(f"tmpl-nvl{r}", node)) if (d := slice_index.as_digest(s))]
    return out, hgx_nodes, nvl_nodes


def claim(name: str, node: str | None = None, device: str = "") -> indexed.ClaimView:
    """Claim ``name`` as the claim index holds it (allocated on ``node``/``device`` when given)."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev"}}]}},
        "status": {},
    }
    if node is not None:
        result = {"driver": "gpu.gpuplane.dev", "request": "gpu", "pool": node, "device": device}
        body["status"] = {"allocation": {"devices": {"results": [result]}}}
    return indexed.claim(body)


def gang(j: int, nodes: tuple[str, str] | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Gang ``g-j`` (2 members x 4 GB200 GPUs, TP=8) and its gated member pods; holding ``nodes`` if given."""
    st: dict[str, Any] = {}
    if nodes is not None:
        members = tuple(
            model.MemberPlacement(member=m, node=n, domain="", gpus=tuple(f"{n}/gpu-{k}" for k in range(4)))
            for m, n in enumerate(nodes)
        )
        decision = model.Decision(request_id=f"{NS}/g-{j}", members=members)
        st = {"phase": "Placing", "placement": placement_record.placement_status(decision)}
    spec = {"members": 2, "gpusPerMember": 4, "tensorParallelSize": 8, "selectors": [GB200]}
    meta = {"name": f"g-{j}", "namespace": NS, "uid": f"uid-g-{j}", "generation": 1}
    meta["creationTimestamp"] = kubetime.rfc3339(time.time() - 60)
    body = {"apiVersion": names.GANG_API_VERSION, "kind": names.GANG_KIND, "metadata": meta, "spec": spec, "status": st}
    pods = []
    for i in range(2):
        pods.append(
            {
                "metadata": {"name": f"g-{j}-pod-{i}", "namespace": NS, "labels": {names.LABEL_GANG: f"g-{j}"}},
                "spec": {
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": f"g-{j}-{i}"}],
                    "schedulingGates": [{"name": names.SCHEDULING_GATE}],
                },
                "status": {"phase": "Pending"},
            }
        )
    return body, pods


def indexes(
    digests: Sequence[slice_index.SliceDigest],
    nodes: Sequence[str],
    claims: Sequence[indexed.ClaimView],
    *,
    gangs: Sequence[Mapping[str, Any]] = (),
    pods: Sequence[Mapping[str, Any]] = (),
    class_spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The controller's indexes (keyword arguments of ``gang.run.make_world``) over these objects, in
    namespace ``NS``, every node schedulable, one DeviceClass ``gpu.gpuplane.dev`` with ``class_spec``."""
    gpu_class = {"metadata": {"name": "gpu.gpuplane.dev"}, "spec": dict(class_spec or {})}
    idx: dict[str, Any] = {
        "gang_idx": {f"{NS}/{g['metadata']['name']}": [gang_view.view(g)] for g in gangs},
        "pod_idx": {f"{NS}/{p['metadata']['name']}": [podview.view(p)] for p in pods},
        "claim_idx": {c.key: [c] for c in claims},
        "slice_idx": {},
        "node_idx": {n: [indexed.NodeView(n, schedulable=True)] for n in nodes},
        "class_idx": {"gpu.gpuplane.dev": [deviceclass.view(gpu_class)]},
    }
    for d in digests:
        idx["slice_idx"].setdefault(d.node, []).append(d)
    return idx


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall seconds of ``fn`` over ``repeat`` calls."""
    took = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t)
    return statistics.median(took)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hgx", type=int, default=800)
    p.add_argument("--gb200", type=int, default=200)
    p.add_argument("--allocated", type=int, default=2800, help="whole-GPU claims allocated on HGX nodes")
    p.add_argument("--pending", type=int, default=7200, help="claims not allocated")
    p.add_argument("--gangs", type=int, default=100, help="half hold a placement, half wait to be placed")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    digests, hgx_nodes, nvl_nodes = fleet(a.hgx, a.gb200)
    claims = [
        claim(f"c-{i}", hgx_nodes[i % len(hgx_nodes)], f"gpu-{(i // len(hgx_nodes)) % 8}") for i in range(a.allocated)
    ]
    claims += [claim(f"p-{i}") for i in range(a.pending)]
    gangs, pods = [], []
    for j in range(a.gangs):
        holds = j < a.gangs // 2 and 2 * j + 1 < len(nvl_nodes)
        body, ps = gang(j, (nvl_nodes[2 * j], nvl_nodes[2 * j + 1]) if holds else None)
        gangs.append(body)
        pods += ps
    print(
        f"fleet: {a.hgx} HGX + {a.gb200} GB200 nodes, {len(digests)} slices, {len(claims)} claims "
        f"({a.allocated} allocated), {a.gangs} gangs ({a.gangs // 2} holding a placement); built in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    rt = runtime.Runtime.create(config.parse_args(["--identity", "bench"], {}), None, metrics.ControllerMetrics())  # type: ignore[arg-type]
    idx = indexes(digests, hgx_nodes + nvl_nodes, claims, gangs=gangs, pods=pods)
    now = time.time()
    w = gang_run.make_world(rt, now=now, **idx)
    key = f"{NS}/g-0"

    def fresh_world() -> Any:
        rt.touched()  # as if an index handler had seen a change: no copy reused
        return gang_run.make_world(rt, now=now, **idx)

    def fresh_pass() -> Any:
        rt.state(gang_run.GangState).plan = None
        return gang_run.plan_for(rt, w, now)

    view = world.cluster_view(w)
    entries = world.entries(w, view)
    compiled = {e.key: world.admit_for(w, e.spec).predicate for e in entries}
    # As before 4333eb9: one filter object per gang, so the pass evaluates it over the fleet per gang.
    apart = {k: (lambda d, a, p=p: p(d, a)) for k, p in compiled.items()}

    def plan_with(admits: Mapping[str, Any]) -> Any:
        return queue_runner.plan(
            entries, view, lambda e: admits[e.key], rt.policy, now=now, settings=gang_run.settings(rt.cfg).queue
        )

    same = [(k, a.kind, a.decision) for k, a in plan_with(apart).actions.items()]
    assert same == [(k, a.kind, a.decision) for k, a in plan_with(compiled).actions.items()], "plans differ"

    def holding(before: bool) -> reconciler.Outcome:
        def view_domains() -> dict[str, str]:
            return {g.id: g.domain for g in fresh_pass()[1].gpus}

        domains = view_domains if before else (lambda: rt.state(gang_run.GangState).domains.of(w))
        return reconciler.decide(
            key, w.gangs[key], w, planned=fresh_pass, domains=domains, now=now, settings=gang_run.settings(rt.cfg)
        )

    decided = holding(False)
    assert holding(True).status == decided.status, "the two ways must decide the same"
    print(f"the holding gang decides {decided.status['phase']}: {decided.status.get('message')}")
    rep = a.repeat
    rows = [
        ("gang.run.make_world (every gang event and timer)", timed(fresh_world, a.repeat)),
        (
            "gang.run.make_world again, nothing indexed changed (world.CopyCache)",
            timed(lambda: gang_run.make_world(rt, now=now, **idx), a.repeat),
        ),
        ("queue pass (gang.run.plan_for, nothing cached)", timed(fresh_pass, rep)),
        ("world.cluster_view (the pass's view)", timed(lambda: world.cluster_view(w), rep)),
        ("queue_runner.plan, one filter per gang (as before)", timed(lambda: plan_with(apart), rep)),
        ("queue_runner.plan, a filter per gang shape (after)", timed(lambda: plan_with(compiled), rep)),
        ("world.gpu_domains (the map built)", timed(lambda: world.gpu_domains(w), rep)),
        (
            "world.DomainCache.of (slices unchanged since the last)",
            timed(lambda: rt.state(gang_run.GangState).domains.of(w), rep),
        ),
        ("decide, holding gang, before (the pass)", timed(lambda: holding(True), rep)),
        ("decide, holding gang, after (domains alone)", timed(lambda: holding(False), rep)),
    ]
    print(f"\n| step | median ms ({a.repeat} runs) | share of one CPU, {a.gangs} gangs every {rt.cfg.resync_s:g} s |")
    print("|---|---|---|")
    for label, s in rows:
        print(f"| {label} | {s * 1e3:.1f} | {s * a.gangs / rt.cfg.resync_s:.0%} |")
    print(f"\nmake_world, a copy against the copy reused: {rows[0][1] / rows[1][1]:.0f}x")
    print(f"queue_runner.plan, before/after: {rows[4][1] / rows[5][1]:.1f}x")
    print(f"holding gang, before/after: {rows[8][1] / rows[9][1]:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
