"""Sharing one GPU between claims.

- ``mps``: per-claim MPS control daemons (start, configure, find again, stop); starts and stops
  processes and writes under the plugin directory.

Time-slicing needs no daemon: ``DeviceState`` (:mod:`gpuplane.driver.prepare.state`) sets the
GPU's time-slice through the hardware backend.
"""
