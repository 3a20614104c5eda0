"""Tests of :mod:`gpuplane.driver.prepare`: the checkpoint, crash safety, MIG and IMEX prepare.

- ``test_checkpoint_recovery``: Crash recovery of the node driver's checkpoint: a corrupt file, a reboot, files of
  other versions, two writers.
- ``test_crash``: Crash safety of the node driver: SIGKILL at every durable step of prepare and unprepare, then
  restart.
- ``test_imex_prepare``: driver.prepare.imex_claims: a claim gets its gang's IMEX channel only when the controller's
  object names it.
- ``test_mig_owed``: MIG instances on a GPU that fell off the bus are owed, not forgotten (issue 18, defect 7, first
  item).
- ``test_mig_rules``: Issue 3, must-show 1: MIG rules through the production prepare path (DeviceState on the
  simulator).
"""
