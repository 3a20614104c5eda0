"""Tests of :mod:`gpuplane.mig`: one MIG geometry shared by the driver and placement.

- ``test_mig_geometry``: One MIG geometry: the driver's create rule and the placement module's slot arithmetic agree
  on every layout.
"""
