"""Tests of :mod:`gpuplane.driver`, one sub-folder per sub-package; here its top-level modules.

- ``hw``: Tests of :mod:`gpuplane.driver.hw`: NVML, the simulator, device nodes and capabilities.
- ``observe``: Tests of :mod:`gpuplane.driver.observe`: health, telemetry, cost, noisy neighbours, claim notices.
- ``plugin``: Tests of :mod:`gpuplane.driver.plugin`: the kubelet plugin's gRPC servers, protos and sockets.
- ``prepare``: Tests of :mod:`gpuplane.driver.prepare`: the checkpoint, crash safety, MIG and IMEX prepare.
- ``publish``: Tests of :mod:`gpuplane.driver.publish`: ResourceSlices, the publisher, claim status, the MIG offer.
- ``sharing``: Tests of :mod:`gpuplane.driver.sharing`: MPS, time-slicing tiers and the IMEX daemons.
- ``test_driver_probes``: gpuplane.driver.probes: /healthz turns unhealthy when a driver loop hangs; /readyz waits
  for its checks.
"""
