"""MIG geometry, written once: the slice layout, the profile tables and the rule for which GPU instances coexist.

Both the node driver (its simulator accepts or refuses a GPU-instance creation with it, and falls
back to its tables when NVML reports no profiles) and the controller's pure placement module
(:mod:`gpuplane.placement.geometry` packs its slot arithmetic from it) import this
package; it imports nothing from either, nothing from Kubernetes, and does no I/O.

- ``geometry``: the 7-compute / 8-memory-slice layout every MIG-capable GPU here shares
  (:data:`geometry.HOPPER`), one :class:`geometry.MigShape` per row, the NVML profile constants,
  and the footprint a GPU instance takes (the coexistence rule); pure.
- ``models``: :class:`models.MigProfile`, one model's row (the names, memory, SMs and engines NVML
  reports), and the table of every GPU model (A100, H100, H200, B200, GB200); pure data.
- ``rules``: :func:`rules.check_create`, the create rule with the refusal NVML would give, on the
  footprint from ``geometry``; pure.
"""
