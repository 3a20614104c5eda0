"""Tests of :mod:`gpuplane.controller.claim`: claim checks, messages and explanations.

- ``test_claim_extended``: The scheduler's claim behind ``nvidia.com/gpu`` (KEP-5004) as the claim checks see it.
- ``test_claim_messages``: What the controller tells a user about a claim says what is wrong, and says it once
  (issue 18, defect 6).
- ``test_controller_claims``: Controller claim checks without a cluster: config validation, the domain warning, why
  a claim waits, the review.
- ``test_mig_profile_scope``: A MIG profile is a GPU model's own: gangs and claim explanations count only GPUs
  publishing it (issue 18, defect 2).
"""
