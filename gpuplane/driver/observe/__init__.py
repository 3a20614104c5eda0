"""Watching the GPUs while they run: health, telemetry, noisy neighbours, cost.

- ``health``: the health policy (events -> conditions -> taints and health views); pure.
- ``health_view``: device health as kubelet's health stream reports it, and ``HealthSource``; no I/O.
- ``health_board``: the in-memory, thread-safe ``HealthSource`` the watcher writes and the gRPC
  health stream reads.
- ``health_watcher``: the thread that feeds hardware events and probes to the policy, and
  persists fatal conditions (``health.json``).
- ``telemetry``: per-device and per-claim gauges on one sampler thread, which also drives
  ``noisy`` and ``cost``.
- ``noisy``: noisy-neighbour detection on MPS-shared GPUs; pure.
- ``cost``: GPU time per claim into a ledger file, and the ``python -m
  gpuplane.driver.observe.cost`` summary.
"""
