"""Benchmarks that print figures, each run as ``python -m bench.<name>`` (not installed with gpuplane).

Ratios are measured side by side in one run; results go into ``docs/`` (``docs_results``).

The node driver:

- ``driver_bench``: prepare/unprepare latency against a measured floor, resident memory, MIG and
  MPS latency; ``driver_harness`` its harness (the driver in its own process, scratch directories).

DRA on a real control plane:

- ``dra_overhead``: apply-to-Running of pods with GPU claims next to the same pods without;
  ``dra_setup`` its objects, ``dra_watch`` its watches on pods and claims, ``dra_stages`` where
  each pod's time went (``--stages``).

Placement on the Alibaba GPU trace (2023, "openb"):

- ``trace``: the trace as placement requests (pods, fleets, replayed workloads).
- ``placement_bench``: gpuplane against first-fit, best-fit and spread; ``placement_deciders`` the
  columns as decision makers (with the kube-scheduler model), ``placement_report`` what a replay
  measured and the tables, ``placement_latency`` decision latency on large filled clusters,
  ``placement_waits`` the default path's waits at saturation against counterfactuals.
- ``frag_bound``: how far each policy is from the best packing of what it runs (a lower bound).
- ``kube_replay``: the trace replayed on the real control plane, kube-scheduler allocating, and
  recorded (``kube_record``: lifecycles from two watches, slice-write counters);
  ``kube_compare`` compares those records (their layout on the model's GPUs: ``kube_layout``) with
  ``kube_model`` (a model of kube-scheduler v1.36 on gpuplane's slices; ``kube_walk`` the order
  its DRA allocator meets a node's devices in).
- ``steer_writes``: the steered layout's slice writes per prepare/unprepare, the stable order against
  re-listing every order, on the same trace arrivals.
- ``rightsize_bench``: fixed MIG profiles against GpuRequests; ``rightsize_replay`` one replay
  with right-sizing, ``rightsize_needs`` trace pods as needs and each variant's options.

Gangs and fleets:

- ``gang_domains``: upstream gang scheduling against gpuplane, which NVLink domain each gang gets;
  ``gang_objects`` the gang sequences and the objects one gang is written as in each API.
- ``fleet_scale``: gpuplane's ResourceSlices for a KWOK fleet against the real scheduler, API
  server, etcd and controller; ``fleet_steps`` one run's state and steps, its measurements
  ``fleet_sched`` (scheduler throughput; ``fleet_tables`` its tables), ``fleet_api`` (apiserver and etcd cost) and
  ``fleet_controller`` (the controller at scale), ``fleet_before`` the code before the fleet-scale
  fixes run beside it, ``fleet_offer`` the fleet under the controller's MIG offer and the time from a MIG
  request for an unpublished profile to its pod bound, ``fleet_probe`` read-only probes of the running
  cluster, ``fleet_profile``
  where a live process's CPU goes (py-spy), ``sched_pprof`` kube-scheduler's CPU profile through each (a)
  round (``--pprof``, Go's pprof), ``newer_scheduler`` the newer kube-scheduler (1.37)
  swapped in for the (a+) rounds, built once into the cache.
- ``gang_reconcile_cost``: what one gang reconcile costs the controller's loop at fleet scale (in
  memory, no API server), a holding gang with the queue pass and with the domains alone;
  ``explain_pass_cost`` one pass of the unallocated-claim explainer over the same indexes, the
  cluster copied once per claim against once per pass.
- ``controller_memory``: the controller's memory on the same fleet, before and after, started one
  after the other on one cluster in minutes; ``fleet_state`` writes that fleet's claims and pods
  straight into the API, allocated as kube-scheduler would.
"""
