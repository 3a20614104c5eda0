"""The two slice checkers (the builder's ``validate_pool`` and :mod:`tests.slicerules`) each catch every violation.

A pool built the production way passes both; each mutation breaks one API limit, and both
checkers must refuse it.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.driver.inventory import discover
from gpuplane.driver.publish.slices import SliceLimitError, build_pool, render_slices, validate_pool
from testing.driverkit import simulator
from tests.slicerules import api_violations


def pool_of(sim: Any) -> list[dict[str, Any]]:
    return render_slices(build_pool(discover("node-a", sim)), 3)


def _mutations() -> list[tuple[str, Any]]:
    def too_many_devices(s: list[dict[str, Any]]) -> None:
        dev_slice = next(x for x in s if x["spec"].get("devices"))
        base = dev_slice["spec"]["devices"][1]
        dev_slice["spec"]["devices"] += [{**base, "name": f"extra-{i}"} for i in range(64)]

    def both(s: list[dict[str, Any]]) -> None:
        s[-1]["spec"]["sharedCounters"] = [{"name": "x", "counters": {"a": {"value": "1"}}}]

    def many_attrs(s: list[dict[str, Any]]) -> None:
        d = s[-1]["spec"]["devices"][0]
        d["attributes"].update({f"extra{i}": {"int": i} for i in range(20)})

    def long_value(s: list[dict[str, Any]]) -> None:
        s[-1]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "x" * 65}

    def bad_attr_name(s: list[dict[str, Any]]) -> None:
        s[-1]["spec"]["devices"][0]["attributes"]["has-dash"] = {"bool": True}

    def bad_device_name(s: list[dict[str, Any]]) -> None:
        s[-1]["spec"]["devices"][0]["name"] = "GPU_0"

    def three_consumptions(s: list[dict[str, Any]]) -> None:
        d = s[-1]["spec"]["devices"][1]
        d["consumesCounters"] = d["consumesCounters"] * 3

    def wrong_count(s: list[dict[str, Any]]) -> None:
        s[0]["spec"]["pool"]["resourceSliceCount"] = 99

    def nine_sets(s: list[dict[str, Any]]) -> None:
        cs = s[0]["spec"]["sharedCounters"][0]
        s[0]["spec"]["sharedCounters"] = [{**cs, "name": f"set-{i}"} for i in range(9)]

    def many_counters(s: list[dict[str, Any]]) -> None:
        cs = s[0]["spec"]["sharedCounters"][0]
        cs["counters"].update({f"c-{i}": {"value": "1"} for i in range(20)})

    def undefined_counter(s: list[dict[str, Any]]) -> None:
        s[-1]["spec"]["devices"][1]["consumesCounters"][0]["counters"]["nope"] = {"value": "1"}

    return [
        (f.__name__, f)
        for f in (
            too_many_devices,
            both,
            many_attrs,
            long_value,
            bad_attr_name,
            bad_device_name,
            three_consumptions,
            wrong_count,
            nine_sets,
            many_counters,
            undefined_counter,
        )
    ]


@pytest.mark.parametrize(("label", "mutate"), _mutations(), ids=[m[0] for m in _mutations()])
def test_both_checkers_catch_each_violation(label: str, mutate: Any) -> None:
    with simulator("hgx-h100") as sim:
        slices = pool_of(sim)
    assert api_violations(slices) == []
    mutate(slices)
    assert api_violations(slices), f"independent checker missed {label}"
    with pytest.raises(SliceLimitError):
        validate_pool(slices)
