"""What the driver and the controller agree on: names, attributes, configuration models, record formats.

Both programs import these modules; they import neither program. None does I/O but ``kuberesponse``, which
reads the body of a response the client already holds.

- ``names``: what the driver publishes and the controller selects on (driver name, attribute
  keys, API group).
- ``configs``: the opaque device configuration (``gpu.gpuplane.dev/v1alpha1``) as strict pydantic models.
- ``kubetime``: times as the API writes them (RFC 3339, UTC): read from any field as unix seconds, or None;
  written as a ``Time`` or ``MicroTime``.
- ``quantity``: Kubernetes resource quantities ("6Gi", "512M") parsed into integers, within bounds.
- ``boundedjson``: API JSON decoded with bounded nesting, so no object a user writes makes a reader recurse;
  ``mapping``/``mappings`` read a field that should be an object (or a list of them) as empty when it is not.
- ``kuberesponse``: the kubernetes client's responses read through that decoder.
- ``ledger``: the cost ledger's record (``Segment``), written by the driver and by the rebalancer.
- ``imex``: the IMEX plan object (``ImexDomain``): its strict parser and ``claims_on``, what the controller tells
  each node's driver about which claims get which IMEX channel.
- ``imex_group``: the ``gpuplane.dev/imex-group`` claim label (an IMEX domain without a gang): its validation and
  the group's id in the plan.
- ``mig_offer``: the MIG offer (which GPUs publish MIG placements), the controller's ConfigMap the drivers read.
- ``noisy_taint``: the noisy-neighbour device taint, the driver's signal to the controller in its ResourceSlice.
"""
