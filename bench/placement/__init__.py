"""Placement on the Alibaba GPU trace (2023, "openb"), in memory: policies, bounds and slice writes.

- ``trace``: the trace as placement requests (pods, fleets, replayed workloads).
- ``placement_bench``: gpuplane against first-fit, best-fit and spread (runnable).
- ``placement_deciders``: the columns as decision makers (with the kube-scheduler model of :mod:`bench.kube`).
- ``placement_report``: what a replay measured, and the tables.
- ``placement_latency``: decision latency on large filled clusters.
- ``placement_waits``: the default path's waits at saturation against counterfactuals (runnable).
- ``frag_bound``: how far each policy is from the best packing of what it runs, a lower bound (runnable).
- ``steer_writes``: the steered layout's slice writes per prepare/unprepare, the stable order against
  re-listing every order, on the same trace arrivals (runnable).
"""
