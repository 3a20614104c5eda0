"""Prepare and unprepare claims: the state machine kubelet drives through the plugin layer.

- ``contract``: the plain values the gRPC layer hands in and gets back (``ClaimRef``,
  ``PrepareResult``, ...) and the ``ClaimPreparer`` protocol; no I/O.
- ``claims``: read a ResourceClaim's allocation (this driver's results, the opaque configs); pure.
- ``planning``: decide before anything is touched (devices, configs, sharing, co-tenants); pure.
- ``state``: ``DeviceState``, the transaction: a process lock and a file lock, the checkpoint
  record before and after, the steps below in order, and their undo in reverse.
- ``mig_ops``: the MIG step: MIG mode, GPU and compute instances (changes the GPU).
- ``sharing_setup``: the sharing step: the claim's MPS daemon (:mod:`gpuplane.driver.sharing`) or
  its GPUs' time-slice (changes the GPU's scheduling, starts processes).
- ``cdi_assembly``: the claim's CDI spec from its record; pure.
- ``cdi``: one CDI spec file per prepared claim (writes under the CDI root).
- ``imex_channel``: a claim's IMEX channel: its node made from ``/proc/devices`` if missing, its CDI edits
  (issue 35).
- ``imex_claims``: which claim gets a channel: the controller's ``ImexDomain`` objects read at prepare
  (strictly parsed, a garbled one ignored), the wait for the domain's readiness, the node made.
- ``recovery``: start-up rollback and rebuild, the periodic cleanup of claims that are gone.
- ``owed``: MIG instances owed after their GPU fell off the bus at unprepare, recorded in the
  checkpoint and destroyed (or found gone) before the next discovery (changes the GPU, Events).
- ``checkpoint``: the crash-safe, versioned, locked record of what is prepared (writes one file).
"""
