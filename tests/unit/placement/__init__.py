"""Tests of :mod:`gpuplane.placement` (pure placement: geometry, policies, preference, queue).

- ``test_placement_geometry``: MIG slot math (``placement.geometry.Slots`` over ``gpuplane.mig.geometry.HOPPER``)
  against the MIG User Guide.
- ``test_placement_policies``: Concrete placement choices: the NVLink rule, gpuplane's slot and domain choices,
  baselines.
- ``test_placement_preference``: placement.preference: the order a driver publishes a node's devices in, and the
  placements to withhold.
- ``test_placement_properties``: Property tests of place() over generated clusters and request streams, for every
  policy.
- ``test_placement_queue``: Queue order with aging, preemption victim selection, DRF fair share.
"""
