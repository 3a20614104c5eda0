"""Tests of :mod:`gpuplane.api`, the shared vocabulary, and of what a user writes through both programs' paths.

- ``test_boundedjson``: gpuplane.api.boundedjson: depth measured without recursion, deep containers cut out, deep
  objects quarantined.
- ``test_bounds``: Every field a user writes is bounded and strictly typed (issue 18, defects 4 and 5).
- ``test_deep_claim_reads``: A claim nested 3,000 levels deep, read by the driver and written by the controller over
  HTTP (issue 18, defect 1).
- ``test_fuzz``: Fuzz: generated opaque configs, ResourceClaims and GpuGangs through the controller's and the
  driver's own paths.
- ``test_kubetime``: gpuplane.api.kubetime: the API's times read from any field (None, never an error) and written
  as it writes them.
- ``test_tier_priority``: MPS client priority per tier: the tier classes set it, a claim may lower it, never raise
  it.
"""
