"""Tests of :mod:`gpuplane.controller.gang`: gangs, their queue, owners, templates, release.

- ``test_controller_gangs``: Controller gang logic without a cluster: slices come from the real driver code on the
  simulator.
- ``test_controller_queue``: The controller's gang queue without a cluster: preemption (never of equal priority),
  DRF, aging, victims.
- ``test_gang_bind_timeout``: A placed gang whose members the scheduler never binds is released and requeued, with a
  reason (issue 18, defect 2).
- ``test_gang_deletion``: What deleting a GpuGang writes (issue 18, defect 7, second item): the rules of
  gang.deleted.
- ``test_gang_leaderworkerset``: Gangs from a LeaderWorkerSet without a cluster: member index from worker-index, the
  LWS as the gang's owner.
- ``test_gang_plan_cost``: What a gang reconcile costs: a queue pass only when the decision needs one, and a slow
  pass reused.
- ``test_gang_priority_preemption``: Issue 32, defect 1: a gang's priority is an entitlement (its pods'
  PriorityClass), never a number its tenant writes; preemption goes through the Eviction API, is dry-run first, and
  a PodDisruptionBudget refuses it whole.
- ``test_gang_release``: A deleted GpuGang is released by whichever replica leads, before kopf lets the object go.
- ``test_gang_templates``: Gangs from templates without a cluster: member indices, template members' steps, owners,
  failure semantics.
- ``test_gang_timeout``: A template gang that times out is given up for good: its Jobs are suspended, told why, and
  nothing stays gated.
- ``test_gang_view``: The gang index's view of a GpuGang: parsed once, total on any body, read-only, overlaid
  without change (issue 34).
- ``test_member_pod_view``: The member-pod index's view of a gang's pod: what membership reads, nothing a
  tenant can inflate, any shape (issue 34).
- ``test_owner_views``: A gang's Jobs and LeaderWorkerSets as the controller indexes them: typed views parsed once
  (issue 34).
"""
