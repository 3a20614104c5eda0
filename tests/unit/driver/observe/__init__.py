"""Tests of :mod:`gpuplane.driver.observe`: health, telemetry, cost, noisy neighbours, claim notices.

- ``test_claim_notices``: A claim whose GPU fell off the bus is told so, once (issue 18, defect 7): Events from the
  checkpoint and taints.
- ``test_cost``: Cost attribution: a scripted day of workloads, accounted tick by tick, against a hand computation.
- ``test_health``: Health policy (pure) and the health watcher on the file-backed simulator.
- ``test_noisy``: Noisy-neighbour detector: threshold, sustain time, hysteresis, tier order, departures.
- ``test_noisy_taints``: The driver's noisy-neighbour taints: one per GPU, figures frozen at the raise, merged with
  health taints.
- ``test_telemetry``: Telemetry sampler on the simulator: DCGM-named gauges with claim labels, attribution,
  noisy-neighbour events.
"""
