"""The fleet harness's pure parts: the node plan, Node bodies, KWOK's stages, whole-GPU-only discovery."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from bench.fleet import claim_index_memory, fleet_controller, fleet_probe, fleet_state
from e2e.cluster import build, controlplane, kwok
from e2e.plane import fleet
from gpuplane.controller import indexed
from gpuplane.driver import inventory
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.publish import slices


class TestPlan:
    def test_mix_and_racks(self) -> None:
        nodes = fleet.plan(800, 200)
        assert len(nodes) == 1000
        hgx = [n for n in nodes if n.profile == "hgx-h100"]
        trays = [n for n in nodes if n.profile == "gb200-nvl72"]
        assert len(hgx) == 800 and len(trays) == 200
        assert hgx[0].name == "hgx-h100-000" and trays[-1].name == "gb200-nvl72-199"
        racks: dict[int, set[str]] = {}
        for t in trays:
            assert t.rack is not None and t.cluster_uuid is not None
            racks.setdefault(t.rack, set()).add(t.cluster_uuid)
        assert len(racks) == 12  # 11 full NVL72 racks of 18 trays and one of 2
        assert all(len(uuids) == 1 for uuids in racks.values())  # one fabric cluster per rack
        assert len({next(iter(u)) for u in racks.values()}) == 12
        assert sum(1 for t in trays if t.rack == 11) == 2

    def test_prefix_and_bad_sizes(self) -> None:
        assert [n.name for n in fleet.plan(1, 1, prefix="t-")] == ["t-hgx-h100-0", "t-gb200-nvl72-0"]
        with pytest.raises(ValueError, match="at least one node"):
            fleet.plan(0, 0)

    def test_node_body_is_kwok_managed_with_capacity(self) -> None:
        node = fleet.plan(0, 1)[0]
        body = fleet.node_body(node)
        labels = body["metadata"]["labels"]
        assert labels[kwok.MANAGED_LABEL] == kwok.MANAGED_VALUE
        assert labels["gpuplane.dev/sim-profile"] == "gb200-nvl72" and labels["gpuplane.dev/rack"] == "nvl72-0"
        assert body["status"]["allocatable"]["pods"] == "110"


class TestKwok:
    def test_stages_are_kwok_stage_objects_for_nodes_and_pods(self) -> None:
        docs = list(yaml.safe_load_all(kwok.stages_yaml()))
        assert [d["kind"] for d in docs] == ["Stage"] * 4
        refs = [d["spec"]["resourceRef"]["kind"] for d in docs]
        assert refs == ["Node", "Node", "Pod", "Pod"]
        delete = docs[3]["spec"]
        assert delete["next"]["delete"] is True
        assert delete["selector"]["matchExpressions"][0] == {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
        heartbeat = docs[1]["spec"]["delay"]
        assert heartbeat["durationMilliseconds"] == kwok.STATUS_REPORT_MS

    def test_pinned_version_and_cache_dir(self, tmp_path: Path) -> None:
        assert kwok.pinned_version() == "v0.8.0"
        bad = tmp_path / "go.mod"
        bad.write_text("module x\n\ngo 1.26.0\n")
        with pytest.raises(build.BuildError, match=r"does not require sigs\.k8s\.io/kwok"):
            kwok.pinned_version(bad)

    def test_ensure_built_reuses_a_cached_binary(self, tmp_path: Path) -> None:
        cached = tmp_path / "kwok" / f"{kwok.pinned_version()}-r{kwok.RECIPE_REVISION}" / "kwok"
        cached.parent.mkdir(parents=True)
        cached.write_text("#!/bin/sh\n")
        cached.chmod(0o755)
        said: list[str] = []
        # No Go on PATH: a cached binary must be returned without looking for the toolchain.
        assert kwok.ensure_kwok(root=tmp_path, environ={"PATH": ""}, out=said.append) == cached
        assert said == []

    def test_missing_binary_without_go_says_what_to_do(self, tmp_path: Path) -> None:
        with pytest.raises(build.BuildError, match="`go` was not found on PATH"):
            kwok.ensure_kwok(root=tmp_path, environ={"PATH": ""}, out=lambda _: None)


class TestWholeGpusOnly:
    def test_no_mig_devices_and_no_counters(self, tmp_path: Path) -> None:
        with Simulator(SimConfig(profile="hgx-h100", state_dir=tmp_path, node_name="n", durable=False)) as sim:
            inv = inventory.discover("n", sim, mig_placements=False)
        content = slices.build_pool(inv)
        objs = slices.render_slices(content, 1)
        slices.validate_pool(objs)
        (only,) = objs
        assert [d["name"] for d in only["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
        assert not any(d.get("consumesCounters") for d in only["spec"]["devices"])

    def test_a_gpu_still_holding_mig_instances_is_not_offered_whole(self, tmp_path: Path) -> None:
        with Simulator(SimConfig(profile="hgx-h100", state_dir=tmp_path, node_name="n", durable=False)) as sim:
            gpu = sorted(sim.gpus(), key=lambda g: g.minor)[2]
            sim.set_mig_mode(gpu.uuid, True)
            profile = next(p for p in sim.mig_profiles(gpu.uuid) if p.name == "3g.40gb")
            gi = sim.create_gpu_instance(gpu.uuid, profile.profile_id, 0)
            owned = [(gpu.uuid, gi.gi_id)]  # the driver's own instance (a claim still prepared)
            inv = inventory.discover("n", sim, owned, mig_placements=False)
        names_ = {d["name"] for s in slices.render_slices(slices.build_pool(inv), 1) for d in s["spec"]["devices"]}
        assert "gpu-2" not in names_ and {f"gpu-{i}" for i in (0, 1, 3, 4, 5, 6, 7)} <= names_


class TestApiserverMemoryLimit:
    def test_auto_is_half_the_machine_and_off_is_none(self) -> None:
        kb = fleet_probe.memory_kb()
        assert kb is not None and kb > 0
        assert fleet_probe.apiserver_memlimit("auto") == f"{kb // 2 // 1024}MiB"
        assert fleet_probe.apiserver_memlimit("off") is None
        assert fleet_probe.apiserver_memlimit("12GiB") == "12GiB"

    def test_the_component_env_reaches_only_its_component(self, tmp_path: Path) -> None:
        plane = controlplane.ControlPlane(
            tmp_path, build.BinPaths.in_directory(tmp_path), component_env={"kube-apiserver": {"GOMEMLIMIT": "3GiB"}}
        )
        for name in ("kube-apiserver", "etcd"):
            plane._spawn(name, ["/bin/sh", "-c", 'echo "limit=${GOMEMLIMIT:-none} path=${PATH:+set}"'])
        for proc, _record in plane._children.values():
            assert proc.wait(timeout=10) == 0
        assert plane.log("kube-apiserver").read_text().strip() == "limit=3GiB path=set"  # over this process's env
        assert plane.log("etcd").read_text().strip() == "limit=none path=set"

    def test_the_sampler_calls_back_once_past_a_threshold(self) -> None:
        class Probe:
            def pids(self) -> dict[str, int]:
                return {"me": os.getpid(), "gone": 2**22 + 7}

        sampler = fleet_probe.PeakSampler(Probe(), every_s=0.02)  # type: ignore[arg-type]
        fired: list[float] = []
        sampler.when_above("me", 1.0, fired.append)
        sampler.when_above("me-too-high", 1e9, fired.append)
        sampler.start()
        deadline = time.monotonic() + 5
        while sampler.peaks.get("me", 0.0) == 0.0 or len(fired) < 1:
            assert time.monotonic() < deadline, "the sampler never sampled this process"
            time.sleep(0.05)
        time.sleep(0.2)  # more samples above the threshold: still one call
        sampler.stop()
        assert len(fired) == 1 and fired[0] > 1.0


def test_controller_env_pairs_parse_and_refuse_malformed_items() -> None:
    from bench.fleet import fleet_controller

    assert fleet_controller.env_pairs(["MALLOC_ARENA_MAX=2", "A=b=c", "EMPTY="]) == {
        "MALLOC_ARENA_MAX": "2",
        "A": "b=c",
        "EMPTY": "",
    }
    with pytest.raises(SystemExit, match=r"NAME=VALUE.*'NOVALUE'"):
        fleet_controller.env_pairs(["X=1", "NOVALUE"])
    with pytest.raises(SystemExit, match="'=3'"):
        fleet_controller.env_pairs(["=3"])


def test_a_step_never_reached_says_so_instead_of_nan() -> None:
    from bench.fleet.fleet_steps import took

    assert took(12.34) == "in 12.3s"
    assert took(41.6, "after the start", 0) == "42s after the start"
    assert took(float("nan")) == "not within the timeout"


def test_the_memory_bench_allocates_no_whole_gpu_twice_and_four_shares_to_a_gpu() -> None:
    kinds = fleet_controller.background_mix(1000)  # 50 four-GPU, 150 one-GPU, 800 shares
    nodes = [f"hgx-{i}" for i in range(100)]
    placed = list(fleet_state.assign(kinds, nodes, with_pods=400))
    assert len(placed) == 400
    assert [p.kind for p in placed].count("gpu-4") == 50 and [p.kind for p in placed].count("gpu-share") == 200
    for p in placed:
        if p.kind == "gpu-4":
            assert len(p.devices) == 4  # four GPUs of one node: one NVLink domain
    whole = [(p.node, d) for p in placed if not p.share for d in p.devices]
    assert len(whole) == len(set(whole))
    shared: dict[tuple[str, str], int] = {}
    for p in placed:
        if p.share:
            shared[(p.node, p.devices[0])] = shared.get((p.node, p.devices[0]), 0) + 1
    assert set(shared.values()) == {4} and not set(shared) & set(whole)
    status = fleet_state.allocation(placed[-1], "pod-uid")["status"]
    (result,) = status["allocation"]["devices"]["results"]
    assert result["pool"] == placed[-1].node and result["consumedCapacity"] == {"sharePercent": "25"}
    assert status["reservedFor"] == [{"resource": "pods", "name": placed[-1].name, "uid": "pod-uid"}]


def test_the_claim_index_memory_bench_measures_the_index_smaller_than_the_bodies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert claim_index_memory.main(["--claims", "200"]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if "B/claim" in line}
    assert set(lines) == {"body", "index"}
    per_claim = {name: float(words[3]) for name, words in lines.items()}
    assert per_claim["index"] * 3 < per_claim["body"]  # a view of what the controller reads, not the object
    view = indexed.claim(claim_index_memory.claim_body(7))
    assert view.allocated and len(view.results) == 4 and view.pod_owners[0].name == "job-7"
