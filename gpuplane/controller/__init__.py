"""gpuplane controller: an operator (informers, work queues and kopf) for claims, gangs and NVLink-aware placement.

It uses the shared layers (:mod:`gpuplane.placement` decides, :mod:`gpuplane.api` names what the driver
publishes) and never imports :mod:`gpuplane.driver` (``tests/unit/repo/test_imports.py``).

Packages, each with its own index:

- ``node``: what the nodes offer, read from the driver's ResourceSlices; pure.
- ``claim``: ResourceClaims of gpuplane's DeviceClasses checked before they reach a node.
- ``gang``: GpuGangs from member pods to an all-or-nothing placement, queued and followed to the end.
- ``steer``: gate-and-steer, gpuplane's node choice for gated pods (kube-scheduler still allocates).
- ``rightsize``: a GpuRequest becomes a ResourceClaimTemplate of ordered alternatives.
- ``rebalance``: a noisy neighbour moved off a GPU it shares with a higher tier.
- ``migoffer``: the MIG offer: which GPUs publish MIG placements, sized per node pool from MIG demand and
  written as the ConfigMap the drivers read (issue 36).
- ``imex``: IMEX domains and channels for gangs across the nodes of an NVLink clique, written as
  ``ImexDomain`` objects by the leader (issue 35; the daemons are not built yet).

The operator around them (these modules do I/O unless marked pure):

- ``main``: ``gpuplane-controller``: configuration read once, logging once, the leader, kopf.
- ``config``: flags with ``GPUPLANE_*`` environment fallbacks, read once in ``main``.
- ``supervisor``: runs kopf in a thread under a supervisor that owns signals and the way out.
- ``leader``: leader election on a ``coordination.k8s.io/v1`` Lease, client-go's semantics.
- ``caches``: what the controller reads: its informer streams (:mod:`gpuplane.informer`) and their indexers; pure.
- ``handlers``: the wiring: informer events to work queues (claims, node labels, gangs, steering), and kopf's
  handlers for GpuGang deletion and GpuRequests, and the background loops' start.
- ``indexed``: what those indexes keep of a ResourceClaim, a Node and a pending Pod; pure.
- ``deviceclass``: what the class index keeps of a DeviceClass (``ClassView``); pure.
- ``claimtemplate``: what the template indexes keep of a ResourceClaimTemplate (``TemplateView``); pure.
- ``periodic``: a leader's background loop (one pass per interval, once synced): explaining, rebalancing.
- ``fleet_gauges``: the gauges the operator's alerts read (pending claims, the largest free block), set by a
  loop on every replica.
- ``heap``: the C allocator for a long-lived process: few arenas, free pages given back after peaks.
- ``memdump``: ``kill -USR2``: a memory report (live objects by type; allocation sites when traced).
- ``slim``: the informers' decode-time transform (a ResourceSlice as its digest, no managedFields).
- ``rejects``: objects that decoder quarantined (nested too deeply), refused with an Event.
- ``runtime``: the operator's memo: the clients and configuration every handler shares, the process lock,
  and each feature's own state reached by its type (``rt.state(GangState)``); imports no feature.
- ``kube``: the API writes: one client built once, plain dicts, idempotent by construction.
- ``steps``: those writes as values (``Step``, ``Eviction``), the vocabulary features decide in; pure.
- ``events``: Kubernetes Events for every decision, what they refer to, how they are recorded.
- ``names``: names the controller owns (the GpuGang API, labels, the gate, annotations, reasons); pure.
- ``metrics``: Prometheus metrics (placement decisions, gang wait time, queue depth).
- ``probes``: liveness and readiness: kopf's health endpoint with a probe of our own.
"""
