"""ResourceClaims that use gpuplane's DeviceClasses, checked before they reach a node.

- ``checks``: config validation with the driver's own models, why a claim stays unallocated,
  a missing NVLink-domain constraint; pure (messages out; the Events are written by
  :mod:`gpuplane.controller.runtime`).
- ``selectors``: the subset of CEL device selectors the controller evaluates itself; pure.
"""
