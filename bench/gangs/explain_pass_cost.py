"""What one pass of the unallocated-claim explainer costs at fleet scale: the cluster copied out of the
indexes once per claim (before) against once per pass (after), side by side in one run.

    python -m bench explain_pass_cost [--hgx 800] [--gb200 200] [--allocated 2800] [--pending 7200] [--repeat 3]

No API server: the indexes of ``bench.gangs.gang_reconcile_cost`` (the driver's own slices as digests,
claims in their indexed form, 60 s old), a writer that keeps what would be written, and the
controller's own ``explainer.explain_pass`` and ``handling.explain_claim``. A first pass explains
every pending claim (an Event and the explained annotation each); the timed passes are the steady
state a restarted controller meets, every claim already explained, so nothing is written and the
cost is all on the event loop. Before: the cluster copied out of the indexes for every claim and the
reason looked up by the claim's requests (encoded each time); after: one copy per pass and the
reason by uid while the view and the classes are the same. The pass runs every
``claim_explain_after_s`` (10 s): the last column says how much of one CPU that is.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from bench.gangs import gang_reconcile_cost as fleetkit
from gpuplane.api import kubetime
from gpuplane.controller import config, events, indexed, metrics, runtime
from gpuplane.controller.claim import checks, explainer, handling
from gpuplane.controller.gang import run as gang_run

GPU = {
    "cel": {"expression": 'device.driver == "gpu.gpuplane.dev" && device.attributes["gpu.gpuplane.dev"].type == "gpu"'}
}


class Writer:
    """What the explainer writes, applied to the indexed claims (as the watch would bring it back: a new entry)."""

    def __init__(self, claims: Mapping[str, list[indexed.ClaimView]]) -> None:
        self.claims, self.events, self.annotated = claims, 0, 0

    def event(self, ref: events.ObjectRef, kind: events.EventType, reason: str, message: str) -> None:
        self.events += 1

    def annotate_claim(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.annotated += 1
        store = self.claims[f"{namespace}/{name}"]
        kept = {**store[0].annotations, **{k: v for k, v in annotations.items() if v is not None}}
        store[0] = dataclasses.replace(store[0], annotations=MappingProxyType(kept))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--hgx", type=int, default=800)
    p.add_argument("--gb200", type=int, default=200)
    p.add_argument("--allocated", type=int, default=2800, help="whole-GPU claims allocated on HGX nodes")
    p.add_argument("--pending", type=int, default=7200, help="claims not allocated (each explained)")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    digests, hgx_nodes, nvl_nodes = fleetkit.fleet(a.hgx, a.gb200)
    old = kubetime.rfc3339(time.time() - 60)
    bodies = [
        fleetkit.claim(f"c-{i}", hgx_nodes[i % len(hgx_nodes)], f"gpu-{i // len(hgx_nodes) % 8}")
        for i in range(a.allocated)
    ]
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplane.dev", "count": 16}}
    for i in range(a.pending):  # more GPUs than any node has: it stays pending, with a reason
        meta = {"name": f"p-{i}", "namespace": fleetkit.NS, "uid": f"uid-p-{i}", "creationTimestamp": old}
        bodies.append(indexed.claim({"metadata": meta, "spec": {"devices": {"requests": [request]}}, "status": {}}))
    idx = fleetkit.indexes(digests, hgx_nodes + nvl_nodes, bodies, class_spec={"selectors": [GPU]})
    claim_idx = idx["claim_idx"]
    writer = Writer(claim_idx)
    cfg = config.parse_args(["--identity", "bench"], {})
    rt = runtime.Runtime.create(cfg, writer, metrics.ControllerMetrics())  # type: ignore[arg-type]
    classes = indexed.single(idx["class_idx"])
    print(
        f"fleet: {a.hgx} HGX + {a.gb200} GB200 nodes, {len(digests)} slices, {len(bodies)} claims "
        f"({a.pending} pending); built in {time.perf_counter() - t0:.1f} s"
    )

    def world() -> Any:
        return gang_run.make_world(rt, now=time.time(), **idx)

    def per_claim() -> explainer.Explain:  # before: the world copied for every claim
        async def explain(claim: indexed.ClaimView, now: float) -> None:
            await handling.explain_claim(rt, claim, classes, world(), now)

        return explain

    def per_pass() -> explainer.Explain:  # after: once per pass
        w = world()

        async def explain(claim: indexed.ClaimView, now: float) -> None:
            await handling.explain_claim(rt, claim, classes, w, now)

        return explain

    def timed(begin: explainer.Begin, reasons: checks.ReasonCache) -> float:
        rt.state(handling.ClaimState).reasons = reasons
        t = time.perf_counter()
        looked = asyncio.run(explainer.explain_pass(claim_idx, begin))
        took = time.perf_counter() - t
        assert looked == a.pending, f"the pass looked at {looked} claims, not {a.pending}"
        return took

    # Before: the answer cached per distinct requests (one encoding of the claim's requests per claim);
    # after: also by uid while the view and the classes stay the same.
    before_cache, after_cache = checks.ReasonCache(claims=0), checks.ReasonCache()
    first = timed(per_pass, after_cache)
    print(f"first pass: {writer.events} Events, {writer.annotated} claims annotated, in {first:.1f} s")
    assert writer.annotated == a.pending, "every pending claim must have been explained once"
    rows = {"a world per claim (before)": [], "a world per pass (after)": []}  # type: dict[str, list[float]]
    for _ in range(a.repeat):
        rows["a world per claim (before)"].append(timed(per_claim, before_cache))
        rows["a world per pass (after)"].append(timed(per_pass, after_cache))
    assert writer.annotated == a.pending, "an explained claim must not be written again"
    every = cfg.claim_explain_after_s
    head = f"explainer pass, {a.pending} pending claims, nothing to write"
    print(f"\n| {head} | median s ({a.repeat} runs) | share of one CPU, a pass every {every:g} s |")
    print("|---|---|---|")
    med = {k: sorted(v)[len(v) // 2] for k, v in rows.items()}
    for label, s in med.items():
        print(f"| {label} | {s:.2f} | {s / every:.0%} |")
    before, after = med.values()
    print(f"\nbefore/after: {before / after:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
