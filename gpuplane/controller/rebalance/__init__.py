"""Rebalancing: moving a noisy neighbour off a GPU it shares with a higher tier.

- ``signal``: noisy-neighbour alerts (the driver's device taints) and a GPU's tenants with their
  tiers, from ResourceSlices and ResourceClaims; pure.
- ``entitlement``: the tier a claim counts as: at most its namespace's administrator-set
  ``gpuplane.dev/max-tier`` (bronze when unlabelled), and the system namespaces never evicted from; pure.
- ``decide``: whether to move the offender now (tiers, persistence, cool-down); pure.
- ``moves``: a move's DeviceTaintRule (keeps the replacement off the GPU) and its ledger line; pure.
- ``act``: one pass: evict through the Eviction API or report, Events, log lines, the ledger;
  does I/O.
- ``loop``: the asyncio task that runs a pass every few seconds while this replica leads; does I/O.
"""
