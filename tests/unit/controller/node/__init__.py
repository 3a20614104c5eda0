"""Tests of :mod:`gpuplane.controller.node`: the slice index's digests over hostile slices.

- ``test_hostile_slices``: Hostile ResourceSlices and quarantined stubs through the controller's indexes: nothing
  raises.
- ``test_slice_pool_node``: Issue 32, defect 5: a slice whose pool is not its node is never read.
"""
