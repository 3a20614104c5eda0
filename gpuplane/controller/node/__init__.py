"""What the nodes offer, read from the driver's ResourceSlices.

- ``labels``: the node -> NVLink-domain label and annotation; pure (the write is in
  :mod:`gpuplane.controller.runtime`).
- ``snapshot_builder``: ResourceSlices, allocated claims and Nodes -> the placement module's
  immutable snapshot; pure.
- ``device_attrs``: what one published device says (qualified attributes, quantities, a MIG
  device's geometry profile from its counters); pure.
"""
