"""Hypothesis strategies for hostile user input: opaque configs, ResourceClaims and GpuGangs.

Each strategy mixes valid objects, near misses (one field wrong, a type off by
one: ``true``, ``"50"``, ``50.0``, 0, 101, a 9,800-digit number) and junk (random
keys, nested values, huge strings), so that the fuzz tests walk both sides of
every rule. Depths stay small enough for ``json.dumps``; the deep cases are built
as text by :mod:`tests.hostile`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from gpuplane.api import names

API = names.CONFIG_API_VERSION

# Scalars a user could write, weighted towards the edges of each rule.
edge_ints = st.sampled_from([0, 1, 2, 20, 50, 99, 100, 101, -1, 2**31, 2**63, 2**64, 10**30])
huge_int = st.just(10**9800)
junk_scalar = st.one_of(
    st.none(),
    st.booleans(),
    edge_ints,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["", "50", "true", "1e3", "Exclusive", "MPS", "gpu-0", "\x00", "😀"]),
)
junk = st.recursive(
    junk_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
quantity_text = st.one_of(
    st.sampled_from(
        [
            "16Gi",
            "1Gi",
            "512Mi",
            "1.5G",
            "1024",
            "0",
            "-1Gi",
            "1.3Ki",
            "5 Mi",
            "100m",
            "1e3",
            "8Ei",
            "7Ei",
            "9223372036854775807",
            "9223372036854775808",
            "Gi",
            "",
            "1.0000000001Gi",
            "16GiB",
        ]
    ),
    st.builds(
        lambda n, s: f"{n}{s}",
        st.integers(min_value=0, max_value=10**12),
        st.sampled_from(["", "Ki", "Mi", "Gi", "k", "M", "G"]),
    ),
    st.just("9" * 9800),
    st.text(max_size=40),
)
device_names = st.one_of(
    st.sampled_from(["gpu-0", "gpu-1", "gpu-7", "gpu-9", "gpu-0-mig-3g-40gb-4", "GPU 0", "", "-gpu", "x" * 64]),
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True),
)


def _maybe(strategy: st.SearchStrategy[Any], junk_weight: int = 1) -> st.SearchStrategy[Any]:
    return st.one_of(*([strategy] * 4), *([junk] * junk_weight))


mps = st.fixed_dictionaries(
    {},
    optional={
        "defaultActiveThreadPercentage": st.one_of(
            edge_ints, st.booleans(), st.sampled_from(["50", 50.0, None]), huge_int
        ),
        "defaultPinnedDeviceMemoryLimit": st.one_of(quantity_text, st.none(), edge_ints),
        "perDevicePinnedMemoryLimit": _maybe(st.dictionaries(device_names, quantity_text, max_size=4)),
        "clientPriority": st.sampled_from(["Normal", "BelowNormal", "normal", "High", "", None, 0, 1]),
        "extra": junk,
    },
)
time_slicing = st.fixed_dictionaries(
    {},
    optional={
        "interval": st.sampled_from(["Default", "Short", "Medium", "Long", "default", "", 5]),
        "shareWithLowerTiers": st.sampled_from([True, False, True, False, "true", 1, 0, None]),
    },
)
sharing = st.fixed_dictionaries(
    {},
    optional={
        "strategy": st.sampled_from(["Exclusive", "TimeSlicing", "MPS", "mps", "", "Bogus", None, 1]),
        "timeSlicing": st.one_of(time_slicing, st.none(), junk),
        "mps": st.one_of(mps, st.none(), junk),
        "extra": junk,
    },
)
opaque_config = st.one_of(
    st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from([API, API, API, "gpu.gpuplane.dev/v1", "", "x" * 300]),
            "kind": st.sampled_from(["GpuConfig", "GpuConfig", "MigDeviceConfig", "Config", "", None]),
        },
        optional={"sharing": st.one_of(sharing, sharing, sharing, junk), "extra": junk},
    ),
    junk,
)
share_text = st.one_of(
    st.sampled_from(["1", "20", "50", "100", "0", "101", "50.5", "1k", "-1", "abc", "9" * 50]),
    st.integers(min_value=-5, max_value=200).map(str),
)

CLASSES = [
    "gpu.gpuplane.dev",
    "mig.gpuplane.dev",
    "mps-bronze.gpu.gpuplane.dev",
    "mps-silver.gpu.gpuplane.dev",
    "mps-gold.gpu.gpuplane.dev",
    "other.example.com",
    "",
]
cel_selectors = st.one_of(
    st.sampled_from(
        [
            'device.attributes["gpu.gpuplane.dev"].minor == 0',
            'device.attributes["gpu.gpuplane.dev"].migProfile == "1g.10gb"',
            'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"',
            "device.driver == 'gpu.gpuplane.dev' && !(device.attributes[\"gpu.gpuplane.dev\"].minor in [1, 2])",
            "(" * 40 + "true" + ")" * 40,
            "!" * 200 + "true",
            " || ".join(["device.driver == 'x'"] * 300),
            'device.capacity["gpu.gpuplane.dev"].memory.compareTo(quantity("16Gi")) >= 0',
        ]
    ),
    st.text(max_size=60),
)


@st.composite
def device_request(draw: st.DrawFn, name: str) -> dict[str, Any]:
    def body() -> dict[str, Any]:
        out: dict[str, Any] = {"deviceClassName": draw(st.sampled_from(CLASSES))}
        if draw(st.booleans()):
            out["count"] = draw(st.sampled_from([1, 2, 4, 8, 0, 100]))
        if draw(st.integers(0, 5)) == 0:
            out["allocationMode"] = draw(st.sampled_from(["All", "ExactCount"]))
        if draw(st.booleans()):
            out["selectors"] = [{"cel": {"expression": e}} for e in draw(st.lists(cel_selectors, max_size=2))]
        if draw(st.booleans()):
            out["capacity"] = {"requests": {"sharePercent": draw(share_text)}}
        return out

    if draw(st.integers(0, 3)) == 0:
        return {"name": name, "firstAvailable": [{"name": f"s{i}", **body()} for i in range(draw(st.integers(1, 3)))]}
    return {"name": name, "exactly": body()}


@st.composite
def resource_claim(draw: st.DrawFn) -> dict[str, Any]:
    """A ResourceClaim as a user may write it (spec only; status added by the tests that need one)."""
    n = draw(st.integers(1, 3))
    requests = [draw(device_request(f"r{i}")) for i in range(n)]
    configs = [
        {
            "requests": draw(st.sampled_from([[], ["r0"], ["r1"], ["r0/s0"], ["nope"]])),
            "opaque": {
                "driver": draw(st.sampled_from([names.DRIVER_NAME, names.DRIVER_NAME, "other.io"])),
                "parameters": draw(opaque_config),
            },
        }
        for _ in range(draw(st.integers(0, 2)))
    ]
    devices: dict[str, Any] = {"requests": requests}
    if configs:
        devices["config"] = configs
    if draw(st.booleans()):
        devices["constraints"] = [
            {"requests": draw(st.sampled_from([[], ["r0"]])), "matchAttribute": "gpu.gpuplane.dev/nvlinkDomain"}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "fuzz", "namespace": "fuzz", "uid": "u-fuzz", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"devices": devices},
    }


gang_spec = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "members": st.one_of(edge_ints, st.sampled_from(["4", True, 4.0, None]), huge_int),
            "gpusPerMember": st.one_of(st.sampled_from([1, 2, 4, 8, 0, -1, "2", None]), edge_ints),
            "migProfile": st.one_of(
                st.sampled_from(["1g.10gb", "3g.71gb", "1g.23gb", "", "x" * 500, None]), st.text(max_size=20)
            ),
            "tensorParallelSize": st.one_of(st.sampled_from([1, 2, 4, 8, 16, 0, 3]), edge_ints),
            "deviceClassName": st.sampled_from([*CLASSES, None, "x" * 300]),
            "selectors": st.one_of(st.lists(cel_selectors, max_size=3), junk),
            "priority": st.one_of(edge_ints, st.sampled_from([-100, "high"])),
            "timeoutSeconds": st.one_of(edge_ints, st.none()),
            "extra": junk,
        },
    ),
    junk,
)
