"""gpuplane's command-line tools for operators and tenants (a third program beside the driver and the controller).

- ``kubectl_gpuplane``: the kubectl plugin ``kubectl gpuplane`` (``kubectl-gpuplane``): ``map``, ``why``, ``usage``.
- ``why``: why a pod or claim waits, or what it got, from the controller's, scheduler's and driver's words; pure.
- ``fleetmap``: the fleet map, pure: slices and claims in, per node and GPU what is held, shared, tainted, free.
- ``fleethtml``: the fleet map and usage as one self-contained HTML page, pure (``map -o html``, the demo's).
- ``usage``: per-tenant usage and cost now, pure, over the fleet map's model (docs/cost.md's charging rules).

It uses the shared layers (:mod:`gpuplane.api`) and never imports the driver or the controller.
"""
