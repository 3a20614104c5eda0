"""What the nodes offer, read from the driver's ResourceSlices.

- ``labels``: the node -> NVLink-domain label and annotation; pure (the write is ``label_sync``).
- ``label_sync``: that label written on a node, leader only (the fleet view's one write).
- ``snapshot_builder``: ResourceSlices, allocated claims and Nodes -> the placement module's
  immutable snapshot; pure.
- ``slice_index``: a ResourceSlice as the controller indexes it (a digest of the fields it reads,
  keyed by node; total on hostile input); pure but for a fleet-wide interner of equal values.
- ``untrusted``: a slice of this driver whose pool is not its node's, not read: counted
  (``gpuplane_untrusted_slices_total``) and logged.
- ``selectors``: the subset of CEL device selectors the controller evaluates itself, and a
  DeviceClass's selectors; pure (the gang queue, steering and the claim checks all evaluate with it).
- ``pod_nodes``: what a pod says of the nodes it may use (nodeSelector, required node affinity); pure
  (steering and the MIG offer read pods with it).
- ``device_attrs``: what one published device says (qualified attributes, quantities, a MIG
  device's counter footprint and geometry profile), every reader total; pure.
"""
