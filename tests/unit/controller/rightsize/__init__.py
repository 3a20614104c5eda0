"""Tests of :mod:`gpuplane.controller.rightsize`: GpuRequest right-sizing.

- ``test_rightsize``: Right-sizing: a GpuRequest's need -> the ordered DRA alternatives -> the ResourceClaimTemplate
  and status.
"""
