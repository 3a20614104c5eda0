"""Tests of :mod:`gpuplane.controller.imex`: IMEX domains, groups, the hold and readiness.

- ``test_imex_controller``: controller.imex wiring: placed gangs read from the indexes, the pass's writes, the
  loop's API calls.
- ``test_imex_decide``: controller.imex.decide: IMEX domains as connected gangs within a clique, one stable channel
  per gang.
- ``test_imex_groups``: IMEX groups (claims labelled ``gpuplane.dev/imex-group``, no gang): the label's validation,
  the controller's grouping and caps, the plan with groups and gangs mixed, the Events on refused claims, and the
  driver's bounded wait for a labelled claim (through the real prepare on a simulated gb200 tray, with an injected
  clock).
- ``test_imex_hold``: A gang across GB200 trays keeps its gates until its IMEX domain lists every member claim
  (issue 35).
- ``test_imex_plan_object``: The IMEX plan object: render -> parse -> claims_on, hostile input refused whole, CRD
  bounds, RBAC.
- ``test_imex_readiness``: What a gang is told of its IMEX domain's readiness, and the readiness bound
  (``gpuplane.controller.imex.readiness``).
"""
