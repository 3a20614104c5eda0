"""Pure placement: a request and an immutable cluster snapshot in, a decision out.

Layers import downward only: ``model`` and ``geometry`` (facts), ``snapshot``
(the indexed immutable cluster), ``fragmentation`` (the size-mix measure),
``policies`` (how to rank candidates), ``place`` (gang all-or-nothing and the
NVLink-domain rule), ``queue`` (priority, aging, preemption, DRF), and ``preference``
(one node's devices in the order gpuplane prefers, for a driver that publishes
them so). No I/O, no Kubernetes imports, no unseeded randomness.
"""
