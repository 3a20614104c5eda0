"""Tests of :mod:`gpuplane.driver.sharing`: MPS, time-slicing tiers and the IMEX daemons.

- ``test_backoff``: driver.sharing.backoff: doubling pauses, capped, never sleeping past the deadline.
- ``test_imex_daemons``: This node's IMEX daemon: the pure decisions (:mod:`gpuplane.driver.sharing.imex_daemons`),
  the addresses the controller writes, and the runner (:mod:`gpuplane.driver.sharing.imex_runner`) driving the real
  stand-ins (``tests/fakes/nvidia-imex``, ``nvidia-imex-ctl``) for two simulated trays on loopback: the domain
  becomes ready through them, a node-file change is a reload (SIGUSR1, same pid), a crashed daemon is restarted with
  backoff and reported, and a domain gone stops the daemon and removes its files.
- ``test_imex_pods``: The IMEX daemon in a pod of its own (:mod:`gpuplane.driver.sharing.imex_pods`,
  ``--imex-daemons=pod``) and the pod's watcher (:mod:`gpuplane.driver.sharing.imex_watch`).
- ``test_mps``: Per-claim MPS control daemons, run against the stand-in ``nvidia-cuda-mps-control``.
- ``test_mps_pods``: MPS control daemons in pods of their own (``--mps-daemons=pod``): the pod, and a daemon that
  outlives its driver.
- ``test_mps_priority``: MPS client priority per claim: the daemon's default (set, read back, recorded by the
  stand-in).
- ``test_mps_recovery``: MPS daemons across driver restarts and crashes: found again, stopped, cleaned up; nothing
  leaks.
- ``test_sharing``: Issue 3, must-show 3 and bad input: MPS and time-slicing through DeviceState on the simulator.
- ``test_timeslice_tiers``: Tiers on a time-sliced GPU, through the driver's prepare path on the simulator.
"""
