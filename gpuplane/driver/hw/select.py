"""The one place where configuration chooses the GpuBackend implementation.

``make_backend("nvml", None)`` returns the real NVML backend (imported lazily, so a node without the
NVIDIA library can still run the simulator); ``make_backend("sim", config)`` returns the simulator.
The caller owns the lifecycle: ``init()`` then ``shutdown()`` in ``finally`` (or ``with``).
"""

from __future__ import annotations

from typing import Literal

from gpuplane.driver.hw.interface import GpuBackend
from gpuplane.driver.hw.sim import SimConfig, Simulator


def make_backend(kind: Literal["nvml", "sim"], sim_config: SimConfig | None = None) -> GpuBackend:
    if kind == "sim":
        if sim_config is None:
            raise ValueError("the simulator backend needs a SimConfig")
        return Simulator(sim_config)
    if kind == "nvml":
        if sim_config is not None:
            raise ValueError("a SimConfig was given for the nvml backend")
        from gpuplane.driver.hw.nvml import NvmlBackend

        return NvmlBackend()
    raise ValueError(f"unknown backend kind {kind!r} (expected 'nvml' or 'sim')")
