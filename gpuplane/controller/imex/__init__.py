"""IMEX for gangs that span nodes of one multi-node NVLink clique (issue 35; ``docs/imex.md``).

Being built. What is here:

- ``decide``: pure: the placed gangs in, the IMEX domains (which nodes run a daemon together) and each
  gang's channel out, stable across passes.
- ``objects``: pure: the plan and each gang's member claims rendered as ``ImexDomain`` objects
  (``gpuplane.api.imex``), and the diff (create, update, delete) against the objects that exist.

Not yet: the kopf handlers that write the objects, the daemon pods and their configuration, the channel
injected into members' claims and the readiness wait in prepare (the driver), the e2e tests on the simulated
GB200 racks.
"""
