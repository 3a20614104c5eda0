"""Tests of :mod:`gpuplane.cli`: ``kubectl gpuplane``'s map, usage and why.

- ``test_fleethtml``: The fleet map as HTML (gpuplane.cli.fleethtml): its structure, its escaping, and its rendering
  in a real browser.
- ``test_fleetmap``: ``kubectl gpuplane map``'s model and drawing (gpuplane.cli.fleetmap), on slices the driver's
  own code publishes.
- ``test_plugin_usage``: ``kubectl gpuplane usage`` (gpuplane.cli.usage): per-tenant GPUs held now, by kind and
  tier, and their cost.
- ``test_plugin_why``: ``kubectl gpuplane why``'s answer (gpuplane.cli.why): the verdict, and what each component
  said, from API dicts.
"""
