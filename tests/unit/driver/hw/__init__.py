"""Tests of :mod:`gpuplane.driver.hw`: NVML, the simulator, device nodes and capabilities.

- ``test_hw_nvml``: NvmlBackend against a fake ``pynvml`` module: error translation, normalization and call shapes.
- ``test_hw_sim_mig``: Simulator MIG behaviour: what may coexist and what NVML would refuse, with the right
  ErrorCode.
- ``test_hw_sim_state``: Simulator state that behaves like hardware: persistence across restarts and processes,
  topology, faults.
- ``test_imex_devices``: IMEX channel devices at the hardware boundary: the majors from /proc/devices, real and
  simulated.
- ``test_sim_devnodes``: The simulator's device nodes and the CDI specs that point containers at them.
"""
