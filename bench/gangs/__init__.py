"""Gangs: which NVLink domain each gang gets, and what the controller's gang and claim passes cost.

- ``gang_domains``: upstream gang scheduling against gpuplane, which NVLink domain each gang gets (runnable).
- ``gang_objects``: the gang sequences, and the objects one gang is written as in each API.
- ``gang_reconcile_cost``: what one gang reconcile costs the controller's loop at fleet scale (in memory,
  no API server), a holding gang with the queue pass and with the domains alone (runnable).
- ``explain_pass_cost``: one pass of the unallocated-claim explainer over the same indexes, the cluster
  copied once per claim against once per pass (runnable).
"""
