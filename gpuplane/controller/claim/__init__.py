"""ResourceClaims that use gpuplane's DeviceClasses, checked before they reach a node.

- ``checks``: config validation with the driver's own models, why a claim stays unallocated,
  a missing NVLink-domain constraint; pure (messages out).
- ``review``: one claim's review: ``decide`` (pure: the annotations, Events and pod conditions to
  write) and ``apply`` (those writes, in order, through :mod:`gpuplane.controller.kube`).
- ``no_match``: why a request's selectors admit no GPU at all (an attribute no GPU publishes, or a
  filter nothing passes); pure.
- ``explainer``: a pass over the claim index every few seconds: why each pending claim waits.
- ``failfast``: the pending pods of a claim the node driver is sure to refuse, failed at once (API writes).
- ``handling``: what the operator does about one claim (the review's writes, the explanation's
  Event and annotation), leader-only; the handlers delegate to it.
"""
