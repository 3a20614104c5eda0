"""Tests of :mod:`gpuplane.driver.publish`: ResourceSlices, the publisher, claim status, the MIG offer.

- ``test_claim_device_status``: status.devices of a prepared claim (KEP-4817): what the container got, from the
  checkpoint record.
- ``test_mig_counters``: Issue 3, must-show 1 (continued): the published counters are the MIG rules.
- ``test_mig_offer_driver``: The driver's side of the MIG offer: which GPUs publish MIG placements, that the pool
  stays valid and accounted, that a placement allocated before the offer shrank still resolves, and the offer's
  parser.
- ``test_publish_steering``: The steered layout (publish.steering) and the publisher's in-place reorder.
- ``test_publisher``: SlicePublisher: which API calls a change costs, and that every state a reader can see is a
  valid pool.
- ``test_publisher_resync``: The slice publisher puts back slices someone else deleted once it compares with the API
  (``force``).
- ``test_slice_rules``: The two slice checkers (the builder's ``validate_pool`` and :mod:`tests.slicerules`) each
  catch every violation.
- ``test_slices``: ResourceSlices for every simulator profile: API limits (checked twice), attributes, NVLink
  domains, stable names.
"""
