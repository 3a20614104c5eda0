"""Gate-and-steer: gpuplane chooses the node, kube-scheduler and its DRA allocator still allocate.

A ``MutatingAdmissionPolicy`` (``manifests/policies/steer-gate.yaml``) adds the
scheduling gate ``gpuplane.dev/steer`` to pods with a ResourceClaim in
namespaces labelled ``gpuplane.dev/steering=enabled``, while the controller's
leader Lease is fresh. The controller then, per gated pod, either writes
gpuplane's node choice into the pod's node affinity and lifts the gate in one
patch, or lifts the gate alone (the pod is not steerable, or nothing fits now:
it waits in the scheduler's own queue). On the node, the driver's published
order (``gpuplane.driver.publish.steering``) makes the allocator take the
device gpuplane prefers.

Modules, each usable alone (issue 13's template gangs reuse ``gate``):

- ``gate``: pure pod-side helpers: who is gated, the steer/release JSON patches
  (``prefer``: a preferred node-affinity term; ``require``: required terms narrowed);
- ``shape``: a pod's claim as a placement request, or why it is left to the scheduler;
- ``decide``: one pass over the gated pods, purely (actions out);
- ``offer_wait``: whether a MIG pod nothing published fits waits, gated, for the MIG offer to grow;
- ``writes``: the patch for each action and which actions a pass writes;
- ``reconciler``: reads, runs a pass, writes one patch per pod; the little state it keeps;
- ``run``: the pass in the running controller (I/O): the namespaces opted in, the view with its
  reservations, ``reconciler.run_pass`` in a thread, under the process lock.
"""
