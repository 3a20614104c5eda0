"""The class index's view of a DeviceClass: its selectors, this driver's configs, whether ours, whether MIG."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.api import configs
from gpuplane.api import names as dn
from gpuplane.controller import caches, deviceclass
from tests import controllerkit


def test_the_shipped_classes_read_as_the_driver_reads_them() -> None:
    shipped = controllerkit.shipped_classes(("*.yaml",))
    gpu, mig, bronze = shipped["gpu.gpuplane.dev"], shipped["mig.gpuplane.dev"], shipped["mps-bronze.gpu.gpuplane.dev"]
    assert gpu.ours and gpu.device_type == dn.DEVICE_TYPE_GPU and gpu.configs == ()
    assert mig.ours and mig.device_type == dn.DEVICE_TYPE_MIG and 'type == "mig"' in " ".join(mig.selectors)
    (parameters,) = bronze.configs  # the MPS tier's limits, as the claim review and right-sizing merge them
    assert configs.parse_config(parameters, "class").sharing.strategy == "MPS"
    assert all(c.ours for c in shipped.values())


def test_a_class_of_another_driver_is_not_ours_and_keeps_none_of_its_configs() -> None:
    body = {
        "metadata": {"name": "nic.example.com"},
        "spec": {
            "selectors": [{"cel": {"expression": 'device.driver == "nic.example.com"'}}],
            "config": [{"opaque": {"driver": "nic.example.com", "parameters": {"mtu": 9000}}}],
        },
    }
    got = deviceclass.view(body)
    assert (got.name, got.ours, got.configs, got.device_type) == ("nic.example.com", False, (), dn.DEVICE_TYPE_GPU)
    assert caches.device_class(body) == {"nic.example.com": got}
    by_config = {"metadata": {"name": "c"}, "spec": {"config": [{"opaque": {"driver": dn.DRIVER_NAME}}]}}
    assert deviceclass.view(by_config).ours and deviceclass.view(by_config).configs == ({},)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"metadata": ["x"], "spec": "all"},
        {"metadata": {"name": 3}, "spec": {"selectors": ["x", {"cel": "y"}], "config": [7, {"opaque": []}]}},
    ],
)
def test_a_class_of_any_shape_reads_as_absent_fields_not_an_error(body: dict[str, Any]) -> None:
    got = deviceclass.view(body)
    assert got.name == "" and not got.ours and got.configs == () and got.device_type == dn.DEVICE_TYPE_GPU
