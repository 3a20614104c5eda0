"""Node driver benchmark: prepare/unprepare latency against a measured floor, resident memory, MIG and MPS latency.

Run ``python -m bench driver_bench [--claims 1000] [--kubeconfig PATH] [--markdown]``.

The harness (the driver process, scratch directories, claim stores) is
:mod:`bench.driver.driver_harness`. The driver is the production code (DeviceState, checkpoint, CDI, MPS manager,
PluginServer) on the simulator, in its own process (``tests/crash_worker.py``);
this process plays kubelet and calls it over the unix socket with
:class:`KubeletPluginClient`. Claims come from a real API server when
``--kubeconfig`` is given (created with ``status.allocation`` written through
the status subresource), else from the in-memory fake of the API; the output
says which.

The floor is what any driver must do per claim, measured in this run,
interleaved claim by claim with the real calls so disk and noise conditions
match: one claim GET through the same client path the driver uses, one CDI
spec write (``atomic_write`` of a spec of the driver's spec size) and one
fsync'd checkpoint write (``CheckpointStore.save`` of a checkpoint of the
driver's size). Target: driver p50 and p99 at most 1.5x the floor's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.driver.driver_harness import NAMESPACE, NODE, ApiStore, ClaimStore, Driver, FakeStore, workdir
from bench.placement.placement_report import percentile as pct
from gpuplane.api import names
from gpuplane.driver.host import atomic_write
from gpuplane.driver.prepare.checkpoint import CheckpointStore, decode
from testing.driverkit import make_claim, ref

GPUS = 8
TARGET_RATIO = 1.5
TARGET_RSS_MB = 80.0
GPU_CONFIG = {"apiVersion": names.CONFIG_API_VERSION, "kind": "GpuConfig"}
MPS_CONFIG = {**GPU_CONFIG, "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}}
TS_CONFIG = {**GPU_CONFIG, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}}}


# ------------------------------------------------------------------------------ helpers


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


# ----------------------------------------------------------------------------- phases
@dataclass
class Series:
    name: str
    values: list[float]

    def row(self, floor: Series | None = None) -> str:
        v = self.values
        cells = [self.name, str(len(v)), ms(pct(v, 0.5)), ms(pct(v, 0.99)), ms(statistics.fmean(v))]
        if floor is not None:
            cells += [f"{pct(v, 0.5) / pct(floor.values, 0.5):.2f}x", f"{pct(v, 0.99) / pct(floor.values, 0.99):.2f}x"]
        else:
            cells += ["", ""]
        return "| " + " | ".join(cells) + " |"


def latency_vs_floor(n: int, kubeconfig: str | None, warmup: int, out: Callable[[str], None]) -> bool:
    with workdir("gpb") as root:
        store: ClaimStore = ApiStore(kubeconfig) if kubeconfig else FakeStore(root)
        total = n + warmup
        claims = [make_claim(f"bench-{i}", NODE, [f"gpu-{i % GPUS}"], namespace=NAMESPACE) for i in range(total)]
        claims = store.add(claims)
        driver = Driver(root, kubeconfig=kubeconfig)
        floor_dir = root / "floor"
        floor_store: CheckpointStore | None = None
        spec_bytes = b""
        cp_size = 0
        prep: list[float] = []
        unprep: list[float] = []
        floor: list[float] = []
        transport: list[float] = []
        try:
            for i, claim in enumerate(claims):
                r = ref(claim)
                t0 = time.perf_counter()
                driver.prepare([r])
                t1 = time.perf_counter()
                if floor_store is None:  # sizes of what the driver wrote for one prepared claim
                    spec_bytes = next((root / "cdi").glob("*.json")).read_bytes()
                    cp = decode((root / "p" / "checkpoint.json").read_bytes())
                    floor_store = CheckpointStore(floor_dir / "checkpoint.json", cp.boot_id)
                    floor_cp = cp
                    floor_store.save(floor_cp)
                    cp_size = floor_store.path.stat().st_size
                t2 = time.perf_counter()
                driver.unprepare([r])
                t3 = time.perf_counter()
                store.get(r.namespace, r.name)
                atomic_write(floor_dir / f"spec-{i % GPUS}.json", spec_bytes, mode=0o644)
                floor_store.save(floor_cp)
                t4 = time.perf_counter()
                driver.noop.prepare([r])
                t5 = time.perf_counter()
                if i >= warmup:
                    prep.append(t1 - t0)
                    unprep.append(t3 - t2)
                    floor.append(t4 - t3)
                    transport.append(t5 - t4)
        finally:
            driver.close()
            store.cleanup()
    f = Series("floor: GET + CDI write + checkpoint write", floor)
    p = Series("prepare (1 whole GPU)", prep)
    u = Series("unprepare (1 whole GPU)", unprep)
    g = Series("transport: same gRPC call to a no-op plugin", transport)
    fg = Series("floor + transport", [a + b for a, b in zip(floor, transport, strict=True)])
    out(f"claims: {store.mode}")
    out(f"{n} claims (after {warmup} warm-up), one whole GPU each, cycling over {GPUS} GPUs; prepare then unprepare")
    out(f"CDI spec {len(spec_bytes)} bytes, checkpoint with the claim {cp_size} bytes\n")
    out("| series | n | p50 ms | p99 ms | mean ms | p50/floor | p99/floor |")
    out("|---|---|---|---|---|---|---|")
    out(f.row())
    out(p.row(f))
    out(u.row(f))
    out(g.row())
    out(fg.row())
    out(
        f"\nfor reference, prepare vs floor + transport: p50 {pct(prep, 0.5) / pct(fg.values, 0.5):.2f}x, "
        f"p99 {pct(prep, 0.99) / pct(fg.values, 0.99):.2f}x"
    )
    ok = pct(prep, 0.5) <= TARGET_RATIO * pct(floor, 0.5) and pct(prep, 0.99) <= TARGET_RATIO * pct(floor, 0.99)
    out(f"\nprepare vs floor, target <= {TARGET_RATIO}x at p50 and p99: {'PASS' if ok else 'FAIL'}")
    return ok


def resident_memory(count: int, out: Callable[[str], None]) -> bool:
    """RSS of the driver with ``count`` prepared claims: MIG slices on half the GPUs, time-sliced shares on the rest."""
    with workdir("gpm") as root:
        store = FakeStore(root)
        claims: list[dict[str, Any]] = []
        mig_gpus = GPUS // 2
        for g in range(mig_gpus):
            for s in range(7):
                claims.append(make_claim(f"mig-{g}-{s}", NODE, [f"gpu-{g}-mig-1g-10gb-{s}"], namespace=NAMESPACE))
        i = 0
        while len(claims) < count:
            g = mig_gpus + i % (GPUS - mig_gpus)
            dev = {"device": f"gpu-{g}", "shareID": f"share-{i}"}
            claims.append(make_claim(f"ts-{i}", NODE, [dev], namespace=NAMESPACE, claim_config=[TS_CONFIG]))
            i += 1
        claims = claims[:count]
        store.add(claims)
        driver = Driver(root)
        try:
            idle = driver.stats()["rss_kib"]
            refs = [ref(c) for c in claims]
            for k in range(0, len(refs), 8):
                driver.prepare(refs[k : k + 8])
            full = driver.stats()["rss_kib"]
            driver.unprepare(refs)
        finally:
            driver.close()
    n_mig = sum(1 for c in claims if c["metadata"]["name"].startswith("mig-"))
    out(
        f"{count} prepared claims: {n_mig} MIG 1g.10gb instances (7 on each of GPUs 0-{mig_gpus - 1}) and "
        f"{count - n_mig} time-sliced shares on GPUs {mig_gpus}-{GPUS - 1}, prepared 8 per call\n"
    )
    out("| driver process | VmRSS MB |")
    out("|---|---|")
    out(f"| started, recovered, serving | {idle / 1024:.1f} |")
    out(f"| with {count} claims prepared | {full / 1024:.1f} |")
    ok = bool(full / 1024 <= TARGET_RSS_MB)
    out(f"\nresident memory target <= {TARGET_RSS_MB:.0f} MB: {'PASS' if ok else 'FAIL'}")
    return ok


def mig_mps_latency(rounds: int, op_latency: float, out: Callable[[str], None]) -> None:
    with workdir("gpg") as root:
        store = FakeStore(root)
        mig = [
            make_claim(f"mig-{r}-{g}-{s}", NODE, [f"gpu-{g}-mig-3g-40gb-{s}"], namespace=NAMESPACE)
            for r in range(rounds)
            for g in range(GPUS)
            for s in (0, 4)
        ]
        mps = [
            make_claim(f"mps-{r}-{g}", NODE, [f"gpu-{g}"], namespace=NAMESPACE, claim_config=[MPS_CONFIG])
            for r in range(rounds)
            for g in range(GPUS)
        ]
        store.add(mig + mps)
        driver = Driver(root, op_latency=op_latency)
        rows: list[str] = []
        try:
            for label, claims, per_round in (("MIG 3g.40gb", mig, 2 * GPUS), ("MPS whole GPU", mps, GPUS)):
                times: dict[str, list[float]] = {"prepare": [], "unprepare": []}
                sim: dict[str, float] = {"prepare": 0.0, "unprepare": 0.0}
                mps_s: dict[str, float] = {"prepare": 0.0, "unprepare": 0.0}
                for r in range(rounds):
                    batch = [ref(c) for c in claims[r * per_round : (r + 1) * per_round]]
                    for op in ("prepare", "unprepare"):
                        call = driver.prepare if op == "prepare" else driver.unprepare
                        before = driver.stats()
                        for cr in batch:
                            t0 = time.perf_counter()
                            call([cr])
                            times[op].append(time.perf_counter() - t0)
                        after = driver.stats()
                        sim[op] += after["sim_time_s"] - before["sim_time_s"]
                        mps_s[op] += after["mps_time_s"] - before["mps_time_s"]
                for op in ("prepare", "unprepare"):
                    v = times[op]
                    mean = statistics.fmean(v)
                    s_mean, m_mean = sim[op] / len(v), mps_s[op] / len(v)
                    rows.append(
                        f"| {label} {op} | {len(v)} | {ms(pct(v, 0.5))} | {ms(pct(v, 0.99))} | {ms(mean)} | "
                        f"{ms(s_mean)} | {ms(m_mean)} | {ms(mean - s_mean - m_mean)} |"
                    )
        finally:
            driver.close()
    out(
        f"simulator op latency {op_latency * 1000:.0f} ms per MIG create/destroy (emulating NVML); MIG claims "
        f"3g.40gb@0 and @4 on {GPUS} GPUs, MPS claims one whole GPU each with the stand-in "
        f"nvidia-cuda-mps-control; {rounds} rounds of prepare-all then unprepare-all\n"
    )
    out("| series | n | p50 ms | p99 ms | mean ms | simulator ms/claim | MPS binary ms/claim | driver's own ms/claim |")
    out("|---|---|---|---|---|---|---|---|")
    for row in rows:
        out(row)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--claims", type=int, default=1000, help="claims for the latency-vs-floor run")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--kubeconfig", default=None, help="use a real API server for claims")
    parser.add_argument("--rss-claims", type=int, default=64)
    parser.add_argument("--mig-rounds", type=int, default=3)
    parser.add_argument("--op-latency", type=float, default=0.02, help="simulated NVML latency per MIG op (s)")
    parser.add_argument("--skip", default="", help="comma list of phases to skip: latency,rss,migmps")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    def out(line: str) -> None:
        print(line, flush=True)

    ok = True
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    out(f"# driver benchmark ({stamp}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs)\n")
    if "latency" not in skip:
        out("## prepare/unprepare latency vs floor\n")
        ok &= latency_vs_floor(args.claims, args.kubeconfig, args.warmup, out)
    if "rss" not in skip:
        out("\n## resident memory\n")
        ok &= resident_memory(args.rss_claims, out)
    if "migmps" not in skip:
        out("\n## MIG and MPS prepare latency\n")
        mig_mps_latency(args.mig_rounds, args.op_latency, out)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
