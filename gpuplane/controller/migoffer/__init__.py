"""The MIG offer (issue 36, docs/mig-offer.md): which GPUs publish their MIG placements, sized by demand.

Publishing every MIG placement of every GPU made kube-scheduler's allocator walk ~190 devices per HGX
node for every pod; the offer keeps MIG placements on the GPUs that need them, and a spare set per pool.

- ``decide``: pure: the fleet's MIG-capable GPUs, the waiting MIG claims and the last pass's memory in;
  the offer out (grown at once for a waiting claim, shrunk slowly, never withdrawn under an allocated
  MIG device), with the Event text for each newly waiting claim.
- ``snapshot``: pure: that view read from the controller's indexes (slices, nodes, claims, pending pods).
- ``reconcile``: the leader's loop (I/O): a pass every few seconds, the ConfigMap ``gpuplane-mig-offer``
  written when the offer changed, Events on waiting claims; started by ``register`` on kopf's registry.
"""
