"""The driver's public API: names, attributes and opaque configuration models shared with the controller.

The controller imports these modules as the driver does. None does I/O but ``kuberesponse``, which
reads the body of a response the client already holds.

- ``names``: what the driver publishes and the controller selects on (driver name, attribute
  keys, API group).
- ``configs``: the opaque device configuration (``gpu.gpuplane.dev/v1alpha1``) as strict pydantic models.
- ``quantity``: Kubernetes resource quantities ("6Gi", "512M") parsed into integers, within bounds.
- ``boundedjson``: API JSON decoded with bounded nesting, so no object a user writes makes a reader recurse.
- ``kuberesponse``: the kubernetes client's responses read through that decoder.
- ``noisy_taint``: the noisy-neighbour device taint, the driver's signal to the controller in its ResourceSlice.
"""
