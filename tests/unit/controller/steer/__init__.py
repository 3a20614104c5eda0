"""Tests of :mod:`gpuplane.controller.steer`: gate-and-steer, hostile tenants, the MIG offer.

- ``test_index_readers_steer``: Steering reads from the controller's compact indexes what it reads from the API
  objects.
- ``test_steer``: Gate-and-steer: the pod patches, a claim's shape, one decision pass, and the pass's writes.
- ``test_steer_hostile``: Steering against hostile tenants (issue 32, defects 2, 3 and 9): gated pods outside the
  opted-in namespaces, pods whose patches always fail, timeouts past the per-pass cap, oversized annotations, forged
  reservations and a pending-pod index a tenant cannot inflate.
- ``test_steer_mig_offer``: Steering under the MIG offer: a gated MIG pod that nothing published fits waits (gated)
  while the offer can grow for it, the offer grows for its claim, and the pod is steered onto what the driver then
  publishes; never onto a placement that is not published.
"""
