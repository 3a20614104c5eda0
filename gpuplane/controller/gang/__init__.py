"""GpuGangs: from member pods to an all-or-nothing placement, queued, written, and followed to the end.

- ``spec``: the GpuGang spec as a frozen pydantic model, and its placement request; pure.
- ``view``: a GpuGang as the gang index keeps it (``GangView``: identity, the spec parsed once, the
  status as written); pure.
- ``world``: one consistent read of the controller's indexes for a queue pass, plus the placement view; pure.
- ``queue_runner``: the gang queue over :mod:`gpuplane.placement.queue` (order,
  fairness, preemption): gangs in, one action per gang out; pure.
- ``podview``: a member pod as the member-pod index keeps it (``MemberPodView``: the labels and annotations
  a member index is read from, its claims, gates, node, phase, affinity, controller, priority); pure.
- ``membership``: which member a pod is (named claim, label, Job completion index, JobSet index,
  LeaderWorkerSet worker index),
  where its claims come from, the gang's member pods by index and why a pod was not counted; pure.
- ``owners``: the Jobs (and JobSets) whose template makes a gang's pods: failed, suspended, Event targets; pure.
- ``leaderworkersets``: the LeaderWorkerSets whose templates make a gang's pods: still there (the gang
  waits for a recreated group) or being deleted (released), Event targets; pure.
- ``release``: when a placed gang is over (owner gave up, a member nobody replaces failed) and
  template claims that do not match the gang; pure.
- ``placement_record``: the placement decision in the gang's status, and back; pure.
- ``desired``: each member's ResourceClaim and its pod's narrowed node affinity; pure.
- ``writes``: the idempotent API steps that apply a placement or a release, in order; pure.
- ``reconciler``: one gang's reconcile, ``decide`` (pure) and ``apply`` (the ordered API writes,
  through :mod:`gpuplane.controller.kube`).
- ``outcome``: what one reconcile decides (``Outcome``), the gang as read (``GangRead``), ``finish``; pure.
- ``unbound``: a placement the scheduler does not follow (members still unbound long after the
  gates were lifted); pure.
- ``preemption``: a victim gang's release and the Eviction API dry run that refuses a preemption a
  PodDisruptionBudget would stop (API reads through :mod:`gpuplane.controller.kube`).
- ``deleted``: a deleted GpuGang: its placement released and every member pod told (API writes).
- ``run``: a gang's reconcile in the running controller (I/O): the World copied from the indexes with the
  write overlay, the queue plan reused while nothing changed, decide in a thread, apply, the victims; and
  :class:`~.run.GangState`, what the feature keeps per process (``rt.state(GangState)``).
- ``handlers``: the kopf registrations (reconcile on change and resync; release on deletion, kopf's
  finalizer holding the gang until the leader has released it).
- ``status``: gang status as merge patches of changed fields, coalesced per gang; pure.
"""
