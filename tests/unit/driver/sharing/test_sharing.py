"""Issue 3, must-show 3 and bad input: MPS and time-slicing through DeviceState on the simulator.

MPS daemons are the production :mod:`gpuplane.driver.sharing.mps` code running the stand-in ``nvidia-cuda-mps-control``
(tests/fakes), which records what each daemon was told in ``<log dir>/standin-record.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from gpuplane.api import names
from gpuplane.driver.host import proc_running as running
from gpuplane.driver.prepare import cdi
from gpuplane.driver.sharing import mps_spec
from gpuplane.mig import geometry
from testing.driverkit import DriverUnderTest, driver_env, make_claim, ref

GIB = 1024**3
GPU = {"apiVersion": names.CONFIG_API_VERSION, "kind": "GpuConfig"}
MIG = {"apiVersion": names.CONFIG_API_VERSION, "kind": "MigDeviceConfig"}
MIG_3G = "gpu-0-mig-3g-40gb-4"


def mps_config(kind: Mapping[str, str] = GPU, **limits: Any) -> dict[str, Any]:
    return {**kind, "sharing": {"strategy": "MPS", "mps": limits}}


def timeslice_config(interval: str, kind: Mapping[str, str] = GPU) -> dict[str, Any]:
    return {**kind, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}}


def shared(device: str, share: str, **consumed: str) -> dict[str, Any]:
    result: dict[str, Any] = {"device": device, "shareID": share}
    if consumed:
        result["consumedCapacity"] = consumed
    return result


@pytest.fixture
def drv() -> Iterator[DriverUnderTest]:
    with driver_env("hgx-h100", "node-a") as d:
        yield d


def prepare(
    drv: DriverUnderTest, name: str, devices: Sequence[str | Mapping[str, Any]], **kw: Any
) -> tuple[dict[str, Any], str]:
    claim = make_claim(name, drv.node, list(devices), **kw)
    drv.claims.add(claim)
    uid = claim["metadata"]["uid"]
    return claim, drv.state.prepare([ref(claim)])[uid].error


def unprepare(drv: DriverUnderTest, claim: Mapping[str, Any]) -> None:
    assert drv.state.unprepare([ref(claim)])[claim["metadata"]["uid"]].error == ""


def daemon_of(drv: DriverUnderTest, claim: Mapping[str, Any]) -> mps_spec.MpsDaemon:
    (daemon,) = [d for d in drv.mps.list_daemons() if d.claim_uid == claim["metadata"]["uid"]]
    return daemon


def record(daemon: mps_spec.MpsDaemon) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((daemon.log_dir / "standin-record.json").read_text())
    return data


def cdi_doc(drv: DriverUnderTest, claim: Mapping[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(cdi.spec_path(drv.cdi_root, claim["metadata"]["uid"]).read_text())
    return doc


def assert_nothing_started(drv: DriverUnderTest, claim: Mapping[str, Any]) -> None:
    uid = claim["metadata"]["uid"]
    assert drv.mps.list_daemons() == [] or all(d.claim_uid != uid for d in drv.mps.list_daemons())
    assert not drv.mps.alive(uid)
    assert not cdi.spec_path(drv.cdi_root, uid).exists()
    assert uid not in drv.state.snapshot().claims


# --- two MPS tenants on one GPU ---------------------------------------------------------------------------
def test_two_tiers_share_a_gpu_each_with_its_own_daemon(drv: DriverUnderTest) -> None:
    uuid = drv.sim.uuid_of_minor(0)
    gold, err = prepare(
        drv,
        "gold",
        [shared("gpu-0", "share-gold", sharePercent="60")],
        class_config=[mps_config(defaultActiveThreadPercentage=60, clientPriority="Normal")],
    )
    assert err == ""
    bronze, err = prepare(
        drv,
        "bronze",
        [shared("gpu-0", "share-bronze", sharePercent="20")],
        class_config=[
            mps_config(
                defaultActiveThreadPercentage=20, defaultPinnedDeviceMemoryLimit="8Gi", clientPriority="BelowNormal"
            )
        ],
    )
    assert err == ""
    prepared = drv.state.prepare([ref(gold), ref(bronze)])  # repeated: answered from the checkpoint
    assert [d.share_id for r in prepared.values() for d in r.devices] == ["share-gold", "share-bronze"]

    d_gold, d_bronze = daemon_of(drv, gold), daemon_of(drv, bronze)
    assert d_gold.pipe_dir != d_bronze.pipe_dir
    tiers = ((gold, d_gold, 60.0, {}, 0), (bronze, d_bronze, 20.0, {"0": 8192}, 1))
    for claim, daemon, pct, limits, priority in tiers:
        rec = record(daemon)
        assert rec["env"]["CUDA_VISIBLE_DEVICES"] == uuid
        assert rec["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(daemon.pipe_dir)
        assert rec["env"]["CUDA_MPS_CLIENT_PRIORITY"] == str(priority)
        assert rec["defaults"] == {
            "active_thread_percentage": pct,
            "device_pinned_mem_limit_mib": limits,
            "client_priority": priority,
        }
        assert f"set_default_client_priority {priority}" in [c["command"] for c in rec["commands"]]
        assert all(c["ok"] for c in rec["commands"])
        doc = cdi_doc(drv, claim)
        mounts = {m["containerPath"]: m["hostPath"] for m in doc["containerEdits"]["mounts"]}
        assert mounts == {mps_spec.CONTAINER_PIPE_DIR: str(daemon.pipe_dir), "/dev/shm": str(daemon.shm_dir)}
        assert f"CUDA_MPS_PIPE_DIRECTORY={mps_spec.CONTAINER_PIPE_DIR}" in doc["containerEdits"]["env"]
        assert f"CUDA_VISIBLE_DEVICES={uuid}" in doc["containerEdits"]["env"]
        assert f"CUDA_MPS_CLIENT_PRIORITY={priority}" in doc["containerEdits"]["env"]
        assert drv.state.snapshot().claims[claim["metadata"]["uid"]].mps_daemon

    gold_pid, bronze_pid = d_gold.pid, d_bronze.pid
    assert gold_pid is not None and bronze_pid is not None
    unprepare(drv, gold)
    assert not running(gold_pid) and not d_gold.root.exists()
    assert running(bronze_pid) and d_bronze.pipe_dir.exists(), "the other tenant keeps its daemon"
    unprepare(drv, bronze)
    assert not running(bronze_pid) and not d_bronze.root.exists()
    assert drv.mps.list_daemons() == [] and drv.cdi_files() == []


PCT, MEM = "defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit"
# (class limits, claim limits, consumedCapacity in the allocation result) -> (daemon %, daemon MiB per device)
LimitCase = tuple[tuple[dict[str, Any], dict[str, Any], dict[str, str]], tuple[float, dict[str, int]]]
LIMIT_CASES: dict[str, LimitCase] = {
    "share-below-class": (({PCT: 60}, {}, {"sharePercent": "40"}), (40.0, {})),
    "claim-below-share": (({PCT: 60}, {PCT: 30}, {"sharePercent": "40"}), (30.0, {})),
    "class-only": (({PCT: 60}, {}, {}), (60.0, {})),
    "consumed-only": (({}, {}, {"sharePercent": "25", "memory": "12Gi"}), (25.0, {"0": 12288})),
    "class-memory-below-consumed": (({MEM: "8Gi"}, {}, {"memory": "12Gi"}), (100.0, {"0": 8192})),
    "claim-memory-below-class": (({MEM: "16Gi"}, {MEM: "10Gi"}, {}), (100.0, {"0": 10240})),
}


@pytest.mark.parametrize("case", list(LIMIT_CASES))
def test_daemon_limits_are_the_tightest_of_class_claim_and_allocation(drv: DriverUnderTest, case: str) -> None:
    (class_limits, claim_limits, consumed), (pct, mib) = LIMIT_CASES[case]
    claim, err = prepare(
        drv,
        "tenant",
        [shared("gpu-2", "s1", **consumed)],
        class_config=[mps_config(**class_limits)],
        claim_config=[mps_config(**claim_limits)] if claim_limits else [],
    )
    assert err == ""
    rec = record(daemon_of(drv, claim))
    # No tier priority in these configs: the daemon keeps NVIDIA's default, 0 (normal).
    assert rec["defaults"] == {
        "active_thread_percentage": pct,
        "device_pinned_mem_limit_mib": mib,
        "client_priority": 0,
    }
    told = [c["command"] for c in rec["commands"]]
    assert any(c.startswith("set_default_active_thread_percentage") for c in told) == (pct != 100.0)
    unprepare(drv, claim)


# --- refusals ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("class_limits", "claim_limits", "message"),
    [
        (
            {"defaultActiveThreadPercentage": 20},
            {"defaultActiveThreadPercentage": 50},
            "mps.defaultActiveThreadPercentage 50 exceeds the device class limit 20",
        ),
        (
            {"defaultActiveThreadPercentage": 20, "defaultPinnedDeviceMemoryLimit": "8Gi"},
            {"defaultPinnedDeviceMemoryLimit": "16Gi"},
            "mps.defaultPinnedDeviceMemoryLimit 16Gi exceeds the device class limit 8Gi",
        ),
        (
            {"defaultPinnedDeviceMemoryLimit": "8Gi"},
            {"perDevicePinnedMemoryLimit": {"gpu-0": "9Gi"}},
            "mps.perDevicePinnedMemoryLimit[gpu-0] 9Gi exceeds the device class limit 8Gi",
        ),
    ],
    ids=["threads", "memory", "per-device-memory"],
)
def test_claim_cannot_loosen_its_class_quota(
    drv: DriverUnderTest, class_limits: dict[str, Any], claim_limits: dict[str, Any], message: str
) -> None:
    claim, err = prepare(
        drv,
        "greedy",
        [shared("gpu-0", "s1")],
        class_config=[mps_config(**class_limits)],
        claim_config=[mps_config(**claim_limits)],
    )
    assert message in err and "may only tighten" in err, err
    assert_nothing_started(drv, claim)
    # Dropping MPS altogether would drop the quota too.
    claim, err = prepare(drv, "escape", ["gpu-0"], class_config=[mps_config(**class_limits)], claim_config=[GPU])
    assert "would drop the device class's MPS quota" in err, err
    assert_nothing_started(drv, claim)
    assert [e[1] for e in drv.claims.events] == ["PrepareFailed", "PrepareFailed"]


@pytest.mark.parametrize("value", [0, 101, -5])
@pytest.mark.parametrize("source", ["class_config", "claim_config"])
def test_thread_percentage_outside_1_to_100_is_refused(drv: DriverUnderTest, value: int, source: str) -> None:
    claim, err = prepare(
        drv, "bad", [shared("gpu-0", "s1")], **{source: [mps_config(defaultActiveThreadPercentage=value)]}
    )
    assert "sharing.mps.defaultActiveThreadPercentage" in err, err
    assert "1..100" in err, err
    assert f"got {value}" in err, err
    assert_nothing_started(drv, claim)


@pytest.mark.parametrize(
    ("device", "kind", "limit", "memory"),
    [("gpu-0", GPU, "96Gi", 81559 * 1024**2), (MIG_3G, MIG, "48Gi", 40448 * 1024**2)],
    ids=["whole", "mig"],
)
def test_memory_limit_above_the_device_memory_is_refused(
    drv: DriverUnderTest, device: str, kind: Mapping[str, str], limit: str, memory: int
) -> None:
    claim, err = prepare(
        drv, "big", [shared(device, "s1")], claim_config=[mps_config(kind, defaultPinnedDeviceMemoryLimit=limit)]
    )
    assert f"exceeds the device's memory {memory} bytes" in err and device in err, err
    assert_nothing_started(drv, claim)
    assert drv.sim.gpu_instances(drv.sim.uuid_of_minor(0)) == (), "no MIG instance made for a refused claim"


def test_zero_or_garbage_memory_limit_names_the_field(drv: DriverUnderTest) -> None:
    for value, text in (("0", "greater than zero"), ("lots", "lots")):
        claim, err = prepare(
            drv, "bad", [shared("gpu-0", "s1")], claim_config=[mps_config(defaultPinnedDeviceMemoryLimit=value)]
        )
        assert "defaultPinnedDeviceMemoryLimit" in err and text in err, err
        assert_nothing_started(drv, claim)


def test_mps_and_exclusive_never_share_a_gpu(drv: DriverUnderTest) -> None:
    exclusive, err = prepare(drv, "owner", ["gpu-0"])
    assert err == ""
    tenant, err = prepare(
        drv, "tenant", [shared("gpu-0", "s1")], claim_config=[mps_config(defaultActiveThreadPercentage=50)]
    )
    assert "already held by claim default/owner" in err and "Exclusive" in err, err
    assert_nothing_started(drv, tenant)
    # And the other way round: MPS first, then an exclusive claim.
    tenant, err = prepare(
        drv, "tenant2", [shared("gpu-1", "s1")], claim_config=[mps_config(defaultActiveThreadPercentage=50)]
    )
    assert err == ""
    late, err = prepare(drv, "late", ["gpu-1"])
    assert "already held by claim default/tenant2" in err and "MPS" in err, err
    assert_nothing_started(drv, late)
    # MPS and time-slicing do not mix either.
    sliced, err = prepare(drv, "sliced", [shared("gpu-1", "s2")], claim_config=[timeslice_config("Short")])
    assert "already held" in err, err
    assert drv.sim.timeslice(drv.sim.uuid_of_minor(1)) == "Default"
    assert_nothing_started(drv, sliced)
    unprepare(drv, tenant)
    unprepare(drv, exclusive)


def test_mps_on_a_mig_device(drv: DriverUnderTest) -> None:
    parent = drv.sim.uuid_of_minor(0)
    claim, err = prepare(drv, "mig-mps", [MIG_3G], class_config=[mps_config(MIG, defaultActiveThreadPercentage=50)])
    assert err == ""
    (gi,) = drv.sim.gpu_instances(parent)
    assert (gi.profile_id, gi.placement_start) == (geometry.GI_PROFILE_3_SLICE, 4)
    assert gi.mig_uuid is not None
    daemon = daemon_of(drv, claim)
    rec = record(daemon)
    assert rec["env"]["CUDA_VISIBLE_DEVICES"] == gi.mig_uuid
    assert rec["defaults"]["active_thread_percentage"] == 50.0
    env = cdi_doc(drv, claim)["containerEdits"]["env"]
    assert f"CUDA_VISIBLE_DEVICES={gi.mig_uuid}" in env
    assert f"CUDA_MPS_PIPE_DIRECTORY={mps_spec.CONTAINER_PIPE_DIR}" in env
    pid = daemon.pid
    assert pid is not None
    unprepare(drv, claim)
    assert not running(pid) and not daemon.root.exists()
    assert drv.sim.gpu_instances(parent) == ()


# --- time-slicing ------------------------------------------------------------------------------------------
def test_timeslicing_interval_applied_and_reset(drv: DriverUnderTest) -> None:
    uuid = drv.sim.uuid_of_minor(1)
    first, err = prepare(drv, "ts1", [shared("gpu-1", "a")], class_config=[timeslice_config("Short")])
    assert err == "" and drv.sim.timeslice(uuid) == "Short"
    second, err = prepare(drv, "ts2", [shared("gpu-1", "b")], class_config=[timeslice_config("Short")])
    assert err == ""
    assert drv.mps.list_daemons() == []
    unprepare(drv, first)
    assert drv.sim.timeslice(uuid) == "Short", "still shared by ts2"
    unprepare(drv, second)
    assert drv.sim.timeslice(uuid) == "Default"
    assert drv.sim.timeslice(drv.sim.uuid_of_minor(0)) == "Default", "other GPUs untouched"


def test_timeslicing_on_a_mig_device_is_refused(drv: DriverUnderTest) -> None:
    for config, text in (
        (timeslice_config("Short", MIG), "strategy 'TimeSlicing' is not supported on MIG devices"),
        (timeslice_config("Short", GPU), "kind 'GpuConfig' does not apply to a 'mig' device"),
    ):
        claim, err = prepare(drv, "ts-mig", [MIG_3G], claim_config=[config])
        assert text in err, err
        assert_nothing_started(drv, claim)
    parent = drv.sim.uuid_of_minor(0)
    assert drv.sim.mig_mode(parent).current is False, "a refused claim does not switch MIG on"
    assert drv.cdi_files() == []


def test_timeslice_intervals_must_agree_on_one_gpu() -> None:
    """Two time-slicing claims on one GPU with different intervals: the second is refused, the first keeps its."""
    from testing.driverkit import driver_env, make_claim, ref

    cfg = {"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "GpuConfig"}
    with driver_env("hgx-h100", "node-a") as drv:
        short = {**cfg, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}}
        long_ = {**cfg, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}
        a = make_claim("a", drv.node, [{"device": "gpu-0", "shareID": "1"}], claim_config=[short])
        b = make_claim("b", drv.node, [{"device": "gpu-0", "shareID": "2"}], claim_config=[long_])
        c = make_claim("c", drv.node, [{"device": "gpu-0", "shareID": "3"}], claim_config=[short])
        drv.claims.add(a, b, c)
        assert drv.state.prepare([ref(a)])[a["metadata"]["uid"]].error == ""
        err = drv.state.prepare([ref(b)])[b["metadata"]["uid"]].error
        assert "interval Short" in err and "Long" in err
        assert drv.sim.timeslice(drv.sim.uuid_of_minor(0)) == "Short"
        assert drv.state.prepare([ref(c)])[c["metadata"]["uid"]].error == ""


def test_partial_share_without_a_sharing_strategy_is_refused() -> None:
    """sharePercent < 100 on a plain exclusive claim would let a second claim land on the GPU: refuse it up front."""
    from testing.driverkit import driver_env, make_claim, ref

    with driver_env("hgx-h100", "node-a") as drv:
        half = make_claim(
            "half", drv.node, [{"device": "gpu-0", "shareID": "1", "consumedCapacity": {"sharePercent": "50"}}]
        )
        whole = make_claim(
            "whole", drv.node, [{"device": "gpu-1", "shareID": "2", "consumedCapacity": {"sharePercent": "100"}}]
        )
        drv.claims.add(half, whole)
        err = drv.state.prepare([ref(half)])[half["metadata"]["uid"]].error
        assert "sharePercent 50" in err and "Exclusive" in err and "MPS or TimeSlicing" in err
        assert drv.cdi_files() == []
        assert drv.state.prepare([ref(whole)])[whole["metadata"]["uid"]].error == ""
