"""Cost attribution: a scripted day of workloads, accounted tick by tick, against a hand computation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuplane.driver.observe import cost
from gpuplane.driver.prepare.checkpoint import Checkpoint, ClaimRecord, DeviceRecord, MigRecord, SharingRecord

H = 3600.0
DAY0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def gpu_dev(minor: int) -> DeviceRecord:
    return DeviceRecord(
        request_names=["r"], pool="n1", device=f"gpu-{minor}", kind="gpu", gpu_uuid=f"GPU-{minor}", gpu_minor=minor
    )


def mig_dev(minor: int, profile: str, start: int, size: int) -> DeviceRecord:
    return DeviceRecord(
        request_names=["r"],
        pool="n1",
        device=f"gpu-{minor}-mig-{profile.replace('.', '-')}-{start}",
        kind="mig",
        gpu_uuid=f"GPU-{minor}",
        gpu_minor=minor,
        mig=MigRecord(parent_uuid=f"GPU-{minor}", profile_id=0, profile_name=profile, start=start, size=size),
    )


def claim(
    uid: str, ns: str, devices: Sequence[DeviceRecord], strategy: str = "Exclusive", pct: int | None = None
) -> ClaimRecord:
    return ClaimRecord(
        uid=uid,
        namespace=ns,
        name=f"claim-{uid}",
        phase="PrepareCompleted",
        devices=list(devices),
        sharing=SharingRecord(strategy=strategy, mps_active_thread_percentage=pct),
    )


# (claim, start hour, end hour, tier) -- the scripted day on one 8-GPU node
SCRIPT: list[tuple[ClaimRecord, float, float, str]] = [
    (claim("a1", "team-a", [gpu_dev(0)]), 0, 8, "whole"),  # 1 GPU x 8 h
    (claim("a2", "team-a", [gpu_dev(1), gpu_dev(2)]), 9, 11, "whole"),  # 2 GPUs x 2 h
    (claim("b1", "team-b", [mig_dev(3, "3g.40gb", 0, 4)]), 0, 10, "mig"),  # 4/8 x 10 h
    (claim("b2", "team-b", [mig_dev(3, "3g.40gb", 4, 4)]), 12, 24, "mig"),  # 4/8 x 12 h
    (claim("b3", "team-b", [mig_dev(4, "1g.10gb", 6, 1)]), 0, 24, "mig"),  # 1/8 x 24 h
    (claim("b4", "team-b", [mig_dev(4, "2g.20gb", 2, 2)]), 6, 12, "mig"),  # 2/8 x 6 h
    (claim("c1", "team-c", [gpu_dev(5)], "MPS", 60), 0, 12, "gold"),  # 0.6 x 12 h
    (claim("c2", "team-c", [gpu_dev(5)], "MPS", 40), 3, 8, "silver"),  # 0.4 x 5 h
    (claim("c3", "team-c", [gpu_dev(6)], "MPS", 20), 0, 24, "bronze"),  # 0.2 x 24 h
    (claim("b5", "team-b", [gpu_dev(6)], "MPS", 20), 20, 23, "bronze"),  # 0.2 x 3 h
    (claim("t1", "team-a", [gpu_dev(7)], "TimeSlicing"), 0, 4, "timeslicing"),  # 2h x 1 + 2h x 1/2
    (claim("t2", "team-c", [gpu_dev(7)], "TimeSlicing"), 2, 6, "timeslicing"),  # 2h x 1/2 + 2h x 1
]

# The hand computation, written out (GPU-hours).
HAND: dict[tuple[str, str], tuple[str, float]] = {
    ("team-a", "whole"): ("1 x 8h + 2 x 2h", 1 * 8 + 2 * 2),
    ("team-a", "timeslicing"): ("1 x 2h + 1/2 x 2h", 1 * 2 + 0.5 * 2),
    ("team-b", "mig"): (
        "4/8 x 10h + 4/8 x 12h + 1/8 x 24h + 2/8 x 6h",
        4 / 8 * 10 + 4 / 8 * 12 + 1 / 8 * 24 + 2 / 8 * 6,
    ),
    ("team-b", "bronze"): ("0.2 x 3h", 0.2 * 3),
    ("team-c", "gold"): ("0.6 x 12h", 0.6 * 12),
    ("team-c", "silver"): ("0.4 x 5h", 0.4 * 5),
    ("team-c", "bronze"): ("0.2 x 24h", 0.2 * 24),
    ("team-c", "timeslicing"): ("1/2 x 2h + 1 x 2h", 0.5 * 2 + 1 * 2),
}


class Sink:
    def __init__(self) -> None:
        self.by_kind: dict[str, float] = {}

    def charge(self, namespace: str, tier: str, kind: str, gpu_seconds: float) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0.0) + gpu_seconds


def run_day(ledger: Path, tick_s: float = 60.0) -> tuple[cost.CostAccountant, Sink]:
    tiers = {rec.uid: tier for rec, _, _, tier in SCRIPT}
    sink = Sink()
    acc = cost.CostAccountant(ledger, "n1", flush_interval_s=900.0, sink=sink)
    t = 0.0
    while t <= 24 * H:
        cp = Checkpoint(claims={rec.uid: rec for rec, s, e, _ in SCRIPT if s * H <= t < e * H})
        acc.tick(cost.holdings(cp, lambda r: tiers[r.uid]), DAY0 + t)
        t += tick_s
    acc.flush()
    return acc, sink


def test_fractions() -> None:
    assert cost.device_fraction(claim("x", "n", [gpu_dev(0)]), gpu_dev(0)) == 1.0
    assert cost.device_fraction(claim("x", "n", []), mig_dev(0, "3g.40gb", 0, 4)) == 0.5
    assert cost.device_fraction(claim("x", "n", [], "MPS", 20), gpu_dev(0)) == 0.2
    assert cost.device_fraction(claim("x", "n", [], "MPS", None), gpu_dev(0)) == 1.0
    assert cost.device_fraction(claim("x", "n", [], "TimeSlicing"), gpu_dev(0), 4) == 0.25


def test_scripted_day_matches_hand_computation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / cost.LEDGER_FILE
    acc, sink = run_day(ledger)
    rows = cost.summarize(cost.read_ledger([ledger]), DAY0, DAY0 + 24 * H)
    computed = {r.group: r.gpu_hours for r in rows}
    table = cost.render(rows, ["namespace", "tier"], DAY0, DAY0 + 24 * H)
    with capsys.disabled():
        print("\n" + table)
        print(f"\n{'NAMESPACE/TIER':<24} {'HAND COMPUTATION':<48} {'HAND':>8} {'LEDGER':>8}")
        for key, (formula, value) in sorted(HAND.items()):
            print(f"{'/'.join(key):<24} {formula:<48} {value:>8.3f} {computed.get(key, 0.0):>8.3f}")
        hand_total = sum(v for _, v in HAND.values())
        print(f"{'TOTAL':<24} {'':<48} {hand_total:>8.3f} {sum(computed.values()):>8.3f}")
    assert set(computed) == set(HAND)
    for key, (_, value) in HAND.items():
        assert computed[key] == pytest.approx(value, abs=1e-9), key
        assert acc.totals[key] / H == pytest.approx(value, abs=1e-9)  # the counter path agrees
    assert sum(sink.by_kind.values()) / H == pytest.approx(sum(v for _, v in HAND.values()))
    assert sink.by_kind["mig"] / H == pytest.approx(HAND[("team-b", "mig")][1])


def test_window_prorates_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / cost.LEDGER_FILE
    run_day(ledger)
    # window 06:00-12:00: a1 2h, b1 4/8x4h, b3 1/8x6h, b4 2/8x6h, a2 2h x2, c1 0.6x6h, c2 0.4x2h, c3 0.2x6h
    rows = cost.summarize(cost.read_ledger([ledger]), DAY0 + 6 * H, DAY0 + 12 * H, by=["namespace"])
    got = {r.group[0]: r.gpu_hours for r in rows}
    assert got["team-a"] == pytest.approx(2 + 4)
    assert got["team-b"] == pytest.approx(0.5 * 4 + 1 / 8 * 6 + 2 / 8 * 6)
    assert got["team-c"] == pytest.approx(0.6 * 6 + 0.4 * 2 + 0.2 * 6)
    assert cost.main(["summary", "--ledger", str(ledger), "--window", "24h", "--end", str(DAY0 + 24 * H)]) == 0
    out = capsys.readouterr().out
    assert "team-b" in out and "TOTAL" in out and f"{sum(v for _, v in HAND.values()):.3f}" in out


def test_torn_line_and_segment_length(tmp_path: Path) -> None:
    ledger = tmp_path / cost.LEDGER_FILE
    run_day(ledger)
    segs = list(cost.read_ledger([ledger]))
    assert max(s.end - s.start for s in segs) <= 900.0 + 60.0
    with open(ledger, "a") as f:
        f.write('{"start": 1, "end"')
    assert len(list(cost.read_ledger([ledger]))) == len(segs)


def test_parse_duration() -> None:
    assert cost.parse_duration("24h") == 86400 and cost.parse_duration("90s") == 90
    with pytest.raises(ValueError):
        cost.parse_duration("1y")
