"""Fleet scale: gpuplane's ResourceSlices for a KWOK fleet against the real scheduler, API server, etcd, controller.

- ``fleet_scale``: the whole run (runnable); ``fleet_steps`` one run's state and its steps.
- ``fleet_sched``: measurement 1, scheduler throughput; ``fleet_tables`` its tables.
- ``fleet_api``: measurement 2, apiserver and etcd cost.
- ``fleet_controller``: measurement 3, the controller at scale.
- ``fleet_before``: the code before the fleet-scale fixes, run beside it.
- ``fleet_offer``: the fleet under the controller's MIG offer, and the time from a MIG request for an
  unpublished profile to its pod bound.
- ``fleet_probe``: read-only probes of the running cluster.
- ``fleet_profile``: where a live process's CPU goes (py-spy).
- ``sched_pprof``: kube-scheduler's CPU profile through each (a) round (``--pprof``, Go's pprof).
- ``newer_scheduler``: the newer kube-scheduler (1.37) swapped in for the (a+) rounds, built once into the cache.
- ``controller_memory``: the controller's memory on the same fleet, before and after, started one after
  the other on one cluster in minutes (runnable).
- ``claim_index_memory``: what the controller's claim index holds per claim against the API's body, and
  against another commit's index (runnable, seconds, no cluster).
- ``fleet_state``: writes that fleet's claims and pods straight into the API, allocated as kube-scheduler would.
"""
