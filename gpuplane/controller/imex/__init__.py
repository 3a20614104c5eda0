"""IMEX for gangs that span nodes of one multi-node NVLink clique (issue 35; ``docs/imex.md``).

Being built. What is here:

- ``decide``: pure: the placed gangs in, the IMEX domains (which nodes run a daemon together) and each
  gang's channel out, stable across passes.
- ``objects``: pure: the plan and each gang's member claims rendered as ``ImexDomain`` objects
  (``gpuplane.api.imex``), and the diff (create, update, delete) against the objects that exist.
- ``gangs``: pure: the gangs holding a placement read from one copy of the indexes (nodes, cliques,
  member claims, the channel the existing objects give them).
- ``groups``: pure: IMEX groups (allocated claims of one namespace labelled ``gpuplane.dev/imex-group`` with one
  name, for hand-placed pods without a gang) gathered into entries the plan treats as gangs; validation, caps
  and the Events for the claims refused.
- ``api``: the ``ImexDomain`` objects in ``gpuplane-system`` listed, created, their spec replaced,
  deleted (fenced writes, through the controller's client).
- ``reconcile``: the leader's pass (``desired``, pure; the loop, I/O) and its start on kopf's registry; each
  pass leaves what it wrote in the runtime's shared state.
- ``hold``: pure: whether a placed gang's gates wait for its domain to list every member claim (read by the
  gang reconcile from what the last pass wrote), bounded, with a Warning when a gang goes on without it.
- ``readiness``: pure: the drivers' reports in the domains' status: the Events a gang is told (a node no
  longer ready, ready again, the domain ready), each gang's nodes not ready, and the readiness bound after
  which the gang reconcile releases a placement whose domain never got ready.

The daemons themselves are the node driver's (``gpuplane.driver.sharing.imex_runner``).
"""
