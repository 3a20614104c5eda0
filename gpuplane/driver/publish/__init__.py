"""From hardware to ResourceSlices: what this node offers the scheduler; and what each claim got.

From :mod:`gpuplane.driver.inventory` (discovery, a layer below ``prepare`` and ``publish``, which both use it):

- ``slices``: inventory -> ResourceSlices (resource.k8s.io/v1) within every API limit; pure.
- ``steering``: the steered layout: each MIG profile's placements in one slice, listed in the
  order gpuplane's policy prefers for the node's state (``placement.preference``); pure.
- ``publisher``: keeps the node's ResourceSlices equal to the desired pool (API writes).
- ``offer_watch``: the MIG offer (``gpuplane.api.mig_offer``) for this node, watched; which GPUs publish MIG
  placements (does I/O).
- ``claim_status``: a prepared claim's devices as its ``status.devices`` (UUID, MIG profile, sharing, MPS
  pipe dir; KEP-4817), written from one thread after each prepare, withdrawn after unprepare.
"""
