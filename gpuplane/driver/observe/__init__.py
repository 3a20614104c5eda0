"""Watching the GPUs while they run: health, telemetry, noisy neighbours, cost.

- ``health``: the health policy (events -> conditions -> taints and health views); pure.
- ``health_view``: device health as kubelet's health stream reports it, and ``HealthSource``; no I/O.
- ``health_board``: the in-memory, thread-safe ``HealthSource`` the watcher writes and the gRPC
  health stream reads.
- ``health_watcher``: the thread that feeds hardware events and probes to the policy, and
  persists fatal conditions (``health.json``).
- ``telemetry``: the sampler thread: each tick samples the GPUs, rebuilds the gauges, feeds the
  noisy-neighbour watch and the cost accountant.
- ``telemetry_metrics``: the metric families (dcgm-exporter's names) and their collector; building
  them is pure.
- ``tiers``: which tier a claim is in (reads each MPS claim once from the API).
- ``attribution``: which claim a GPU process belongs to (reads ``/proc``).
- ``noisy_watch``: bandwidth shares on MPS-shared GPUs into ``noisy``, alerts into Events and counters.
- ``noisy``: noisy-neighbour detection on MPS-shared GPUs; pure.
- ``noisy_taints``: the active alerts as device taints for the publisher (the controller's signal).
- ``claim_notices``: a Warning Event on each prepared claim that holds a device on a newly
  tainted (unhealthy) GPU, once per claim, GPU and taint.
- ``cost``: GPU time per claim into a ledger file, and the ``python -m
  gpuplane.driver.observe.cost`` summary.
"""
