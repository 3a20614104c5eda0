"""Tests of :mod:`gpuplane.controller`, one sub-folder per feature; here its wiring, indexes and base modules.

- ``claim``: Tests of :mod:`gpuplane.controller.claim`: claim checks, messages and explanations.
- ``gang``: Tests of :mod:`gpuplane.controller.gang`: gangs, their queue, owners, templates, release.
- ``imex``: Tests of :mod:`gpuplane.controller.imex`: IMEX domains, groups, the hold and readiness.
- ``migoffer``: Tests of :mod:`gpuplane.controller.migoffer`: the controller's MIG offer.
- ``node``: Tests of :mod:`gpuplane.controller.node`: the slice index's digests over hostile slices.
- ``rebalance``: Tests of :mod:`gpuplane.controller.rebalance`: noisy-neighbour rebalancing and its tenancy rules.
- ``rightsize``: Tests of :mod:`gpuplane.controller.rightsize`: GpuRequest right-sizing.
- ``steer``: Tests of :mod:`gpuplane.controller.steer`: gate-and-steer, hostile tenants, the MIG offer.
- ``test_controller_indexes``: The controller's compact indexes: slices as digests, claims and nodes as the fields
  it reads.
- ``test_controller_leader``: Lease leader election as a state machine: a fake clock, an in-memory Lease with
  resourceVersions.
- ``test_controller_probes``: gpuplane.controller.probes on kopf's own health endpoint: healthy while the loop
  turns, not when it hangs.
- ``test_controller_wiring``: Controller wiring without a cluster: config parsing, lease settings, the kopf
  registry, write fencing.
- ``test_claimtemplate``: gpuplane.controller.claimtemplate: a ResourceClaimTemplate as the template index keeps
  it, and right-sizing's memory of the templates it just made (read back as the index will hold them).
- ``test_deviceclass``: The class index's view of a DeviceClass: its selectors, this driver's configs, whether
  ours, whether MIG.
- ``test_fleet_gauges``: The controller's fleet gauges (``gpuplane.controller.fleet_gauges``): the numbers the
  operator's alerts read.
- ``test_heap``: The controller's C-allocator settings: the arena cap, and the trim loop's timing.
- ``test_index_readers``: Every reader of the controller's compact indexes gets from them what it gets from the API
  objects.
- ``test_index_removal``: An object that stops qualifying for an index leaves it, and the plan sees the change (the
  controller's informers).
- ``test_memdump``: The controller's on-demand memory report (SIGUSR2).
- ``test_slim``: What the informers keep of a watched object (gpuplane.controller.slim): the slice index is
  unchanged.
- ``test_supervisor``: gpuplane.controller.supervisor in real processes: a failed or stalled operator ends the
  replica, SIGTERM always does.
"""
