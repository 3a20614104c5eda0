"""Prepare and unprepare claims: the state machine kubelet drives through the plugin layer.

- ``contract``: the plain values the gRPC layer hands in and gets back (``ClaimRef``,
  ``PrepareResult``, ...) and the ``ClaimPreparer`` protocol; no I/O.
- ``claims``: read a ResourceClaim's allocation (this driver's results, the opaque configs); pure.
- ``planning``: decide before anything is touched (devices, configs, sharing, co-tenants); pure.
- ``state``: ``DeviceState``, which executes plans under a process lock and a file lock: MIG
  instances through the hardware backend, MPS daemons (:mod:`gpuplane.driver.sharing`),
  time-slicing, CDI specs, the checkpoint.
- ``cdi``: one CDI spec file per prepared claim (writes under the CDI root).
- ``checkpoint``: the crash-safe, versioned, locked record of what is prepared (writes one file).
"""
