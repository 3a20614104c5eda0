"""Tests of :mod:`gpuplane.controller.migoffer`: the controller's MIG offer.

- ``test_mig_offer_controller``: The controller's MIG offer: sized from waiting claims and a spare set, grown at
  once, shrunk slowly, never withdrawn under an allocated MIG device; and the snapshot it decides on, read from
  claims, pods and slices.
"""
