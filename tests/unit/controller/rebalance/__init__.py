"""Tests of :mod:`gpuplane.controller.rebalance`: noisy-neighbour rebalancing and its tenancy rules.

- ``test_rebalance``: Noisy-neighbour rebalancing: the rule (decide), the pass (act) against a recording writer, the
  ledger.
- ``test_rebalance_tenancy``: Rebalancing among tenants (issue 32, defect 4): tiers are entitlements, not a claim's
  word.
"""
