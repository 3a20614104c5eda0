"""Every field a user writes is bounded and strictly typed (issue 18, defects 4 and 5).

Through the production paths: :mod:`gpuplane.api.quantity` and :mod:`gpuplane.api.configs`
(what the controller and the driver both validate with), ``DeviceState.prepare`` on
the simulator (the driver's answer per claim, its Events), the controller's
``claims.validate``, and the CEL pre-filter the controller compiles gang and claim
selectors with.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuplane.api import configs, names, quantity
from gpuplane.controller import deviceclass
from gpuplane.controller.claim import checks as controller_claims
from gpuplane.controller.node import selectors
from testing.driverkit import DriverUnderTest, driver_env, make_claim, ref

GPU = {"apiVersion": names.CONFIG_API_VERSION, "kind": "GpuConfig"}
HUGE = "9" * 9800


def mps(**limits: Any) -> dict[str, Any]:
    return {**GPU, "sharing": {"strategy": "MPS", "mps": limits}}


class TestQuantity:
    @pytest.mark.parametrize(
        ("value", "words"),
        [
            (HUGE, "too long for a quantity"),
            (HUGE + "Gi", "too long for a quantity"),
            ("9223372036854775808", "exceeds the largest quantity"),
            ("8Ei", "exceeds the largest quantity"),
            pytest.param(10**5000, "exceeds the largest quantity", id="5001-digit-int"),
            (-1, "negative"),
            (True, "not a quantity"),
            ("1.5", "not a whole number"),
            ("6 GiB", "not a quantity"),
            (2.5, "not a quantity"),
        ],
    )
    def test_refused_with_a_short_message(self, value: Any, words: str) -> None:
        with pytest.raises(ValueError, match=words) as err:
            quantity.parse_quantity(value)
        assert len(str(err.value)) < 200

    def test_the_largest_quantity_is_accepted(self) -> None:
        assert quantity.parse_quantity("9223372036854775807") == 2**63 - 1
        assert quantity.parse_quantity("7Ei") == 7 * 2**60

    def test_shown_never_turns_a_huge_int_into_text(self) -> None:
        assert quantity.shown(10**9000) == "<an integer of about 9001 digits>"
        assert quantity.shown("x" * 1000).endswith("(1000 characters)")

    @pytest.mark.parametrize(("value", "pct"), [("1", 1), ("100", 100), ("20", 20), (50, 50)])
    def test_share_percent_is_a_whole_1_to_100(self, value: Any, pct: int) -> None:
        assert quantity.share_percent(value) == pct

    @pytest.mark.parametrize("value", ["0", "101", "1k", "50.5", "-1", HUGE, "", True])
    def test_other_shares_are_refused(self, value: Any) -> None:
        with pytest.raises(ValueError, match="sharePercent"):
            quantity.share_percent(value)


class TestStrictConfig:
    @pytest.mark.parametrize(
        ("limits", "words"),
        [
            ({"defaultActiveThreadPercentage": True}, "valid integer (got True)"),
            ({"defaultActiveThreadPercentage": "50"}, "valid integer (got '50')"),
            ({"defaultActiveThreadPercentage": 50.0}, "valid integer (got 50.0)"),
            pytest.param({"defaultActiveThreadPercentage": 10**5000}, "1..100", id="5001-digit-int"),
            ({"defaultPinnedDeviceMemoryLimit": HUGE}, "at most 32 characters"),
            ({"defaultPinnedDeviceMemoryLimit": 17179869184}, "valid string"),
            ({"perDevicePinnedMemoryLimit": {"GPU 0": "1Gi"}}, "should match pattern"),
            ({"perDevicePinnedMemoryLimit": {"x" * 64: "1Gi"}}, "at most 63 characters"),
            ({"perDevicePinnedMemoryLimit": {f"gpu-{i}": "1Gi" for i in range(129)}}, "at most 128 items"),
            ({"perDevicePinnedMemoryLimit": {"gpu-0": HUGE}}, "at most 32 characters"),
        ],
    )
    def test_loose_or_unbounded_values_are_config_errors(self, limits: dict[str, Any], words: str) -> None:
        with pytest.raises(configs.ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
            configs.parse_config(mps(**limits))
        assert len(str(err.value)) <= configs.MAX_MESSAGE + 40

    def test_exact_types_are_accepted(self) -> None:
        cfg = configs.parse_config(
            mps(
                defaultActiveThreadPercentage=50,
                defaultPinnedDeviceMemoryLimit="16Gi",
                perDevicePinnedMemoryLimit={"gpu-0": "8Gi", "gpu-0-mig-3g-40gb-4": "4Gi"},
            )
        )
        assert cfg.sharing.mps is not None and cfg.sharing.mps.defaultActiveThreadPercentage == 50

    def test_a_hostile_config_of_many_errors_gives_one_bounded_message(self) -> None:
        bad: dict[str, Any] = {**GPU, "sharing": {"strategy": "MPS", "mps": {f"k{i}": "x" * 500 for i in range(500)}}}
        with pytest.raises(configs.ConfigError) as err:
            configs.parse_config(bad)
        assert len(str(err.value)) <= configs.MAX_MESSAGE + 40

    def test_apiversion_and_kind_are_shown_bounded(self) -> None:
        with pytest.raises(configs.ConfigError, match="characters") as err:
            configs.parse_config({"apiVersion": "v" * 100_000, "kind": "GpuConfig"})
        assert len(str(err.value)) < 200
        with pytest.raises(configs.ConfigError, match="kind must be one of"):
            configs.parse_config({"apiVersion": names.CONFIG_API_VERSION, "kind": ["GpuConfig"]})


@pytest.fixture
def drv() -> Iterator[DriverUnderTest]:
    with driver_env("hgx-h100", "node-a") as d:
        yield d


def prepare(drv: DriverUnderTest, claim: dict[str, Any]) -> str:
    drv.claims.add(claim)
    return drv.state.prepare([ref(claim)])[claim["metadata"]["uid"]].error


class TestPrepare:
    def test_a_9800_digit_limit_is_a_config_error_with_an_event(self, drv: DriverUnderTest) -> None:
        claim = make_claim("huge", drv.node, ["gpu-0"], claim_config=[mps(defaultPinnedDeviceMemoryLimit=HUGE)])
        error = prepare(drv, claim)
        assert "at most 32 characters" in error and "internal error" not in error
        assert [r for _, r, _ in drv.claims.events] == ["PrepareFailed"]

    def test_true_as_a_thread_percentage_is_refused(self, drv: DriverUnderTest) -> None:
        claim = make_claim("pct", drv.node, ["gpu-0"], claim_config=[mps(defaultActiveThreadPercentage=True)])
        assert "valid integer (got True)" in prepare(drv, claim)
        assert drv.state.snapshot().claims == {}

    def test_an_allocated_zero_share_is_refused(self, drv: DriverUnderTest) -> None:
        device = {"device": "gpu-0", "shareID": "s0", "consumedCapacity": {"sharePercent": "0"}}
        claim = make_claim("zero", drv.node, [device], claim_config=[mps()])
        error = prepare(drv, claim)
        assert "sharePercent 0 is outside 1..100" in error and drv.state.snapshot().claims == {}

    def test_a_requested_zero_share_is_refused_though_the_scheduler_rounded_it_up(self, drv: DriverUnderTest) -> None:
        device = {"device": "gpu-0", "shareID": "s0", "consumedCapacity": {"sharePercent": "1"}}
        claim = make_claim("zero", drv.node, [device], claim_config=[mps()])
        claim["spec"]["devices"]["requests"] = [
            {"name": "gpu", "exactly": {"deviceClassName": "x", "capacity": {"requests": {"sharePercent": "0"}}}}
        ]
        error = prepare(drv, claim)
        assert "request 'gpu': capacity.requests.sharePercent 0 is outside 1..100" in error

    def test_unknown_device_names_in_per_device_limits_are_reported(self, drv: DriverUnderTest) -> None:
        limits = {"gpu-0": "8Gi", "gpu-9": "1Gi", "gpu-7": "2Gi"}
        device = {"device": "gpu-0", "shareID": "s0", "consumedCapacity": {"sharePercent": "20"}}
        claim = make_claim("unknown", drv.node, [device], claim_config=[mps(perDevicePinnedMemoryLimit=limits)])
        assert prepare(drv, claim) == ""
        (event,) = [e for e in drv.claims.events if e[1] == "ConfigIgnored"]
        assert "names gpu-7, gpu-9, not allocated to this claim (it got gpu-0)" in event[2]
        (rec,) = drv.state.snapshot().claims.values()
        assert list(rec.sharing.mps_pinned_limits.values()) == [8 * 2**30]  # gpu-0's own entry applies
        assert drv.state.unprepare([ref(claim)])[claim["metadata"]["uid"]].error == ""


class TestControllerValidation:
    CLASSES = {
        "gpu.gpuplane.dev": deviceclass.view(
            {"spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.gpuplane.dev"'}}]}}
        )
    }

    def claim(self, share: Any = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": "gpu.gpuplane.dev"}
        if share is not None:
            exactly["capacity"] = {"requests": {"sharePercent": share}}
        spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
        if params is not None:
            spec["devices"]["config"] = [{"opaque": {"driver": names.DRIVER_NAME, "parameters": params}}]
        return {"metadata": {"name": "c", "namespace": "ns"}, "spec": spec}

    @pytest.mark.parametrize("share", ["0", "101", "abc", HUGE])
    def test_a_share_outside_1_to_100_is_flagged(self, share: str) -> None:
        (problem,) = controller_claims.validate(self.claim(share, mps()), self.CLASSES)
        assert "sharePercent" in problem and len(problem) < 400

    def test_strict_types_are_flagged_before_a_node_sees_them(self) -> None:
        (problem,) = controller_claims.validate(self.claim("20", mps(defaultActiveThreadPercentage="50")), self.CLASSES)
        assert "valid integer (got '50')" in problem


class TestSelectors:
    def test_deep_nesting_is_not_prefiltered(self) -> None:
        leaf = 'device.driver == "x"'
        assert selectors.compile_selector("(" * 40 + leaf + ")" * 40) is None
        assert selectors.compile_selector("!" * 1000 + leaf) is None
        ok = selectors.compile_selector("(" * 30 + leaf + ")" * 30)
        assert ok is not None and ok("x", {})

    def test_a_long_chain_evaluates_without_recursion(self) -> None:
        chain = " || ".join(['device.driver == "y"'] * 160 + ['device.driver == "x"'])
        assert len(chain) <= selectors.MAX_EXPRESSION
        pred = selectors.compile_selector(chain)
        assert pred is not None and pred("x", {}) and not pred("z", {})

    def test_an_overlong_selector_matches_everything(self) -> None:
        compiled = selectors.compile_all(["device.driver == 'x' && " * 500 + "true"])
        assert compiled.unsupported and compiled.predicate("anything", {})
