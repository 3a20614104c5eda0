"""Unit tests (fast, always run: ``python -m pytest -q tests/unit``), laid out as the source tree.

``tests/unit/<package>/`` tests ``gpuplane/<package>/`` (sub-folders follow the package's own sub-packages,
e.g. ``driver/hw`` tests ``gpuplane/driver/hw``); a test that covers two packages sits with the one it
mostly drives. ``repo`` tests the repository itself rather than one package. The suite's switches are
in ``tests/conftest.py``; the kits the test modules share are listed in :mod:`tests`.

- ``api``: Tests of :mod:`gpuplane.api`, the shared vocabulary, and of what a user writes through both programs'
  paths.
- ``cli``: Tests of :mod:`gpuplane.cli`: ``kubectl gpuplane``'s map, usage and why.
- ``controller``: Tests of :mod:`gpuplane.controller`, one sub-folder per feature; here its wiring, indexes and base
  modules.
- ``driver``: Tests of :mod:`gpuplane.driver`, one sub-folder per sub-package; here its top-level modules.
- ``httpauth``: Tests of :mod:`gpuplane.httpauth`: the metrics and health endpoints' authentication and binding.
- ``informer``: Tests of :mod:`gpuplane.informer`: the informer, its HTTP client and the work queue.
- ``mig``: Tests of :mod:`gpuplane.mig`: one MIG geometry shared by the driver and placement.
- ``placement``: Tests of :mod:`gpuplane.placement` (pure placement: geometry, policies, preference, queue).
- ``repo``: Tests of the repository itself rather than one package: import contracts, layout, package indexes, the
  monitoring manifests (``rules/*.test.yaml``: promtool's alert tests), the benchmarks and the e2e harness.
"""
