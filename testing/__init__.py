"""Builders shared by the tests, the benchmarks and the e2e harness (``bench`` and ``tests`` both import this;
``bench`` never imports ``tests``, a contract of ``tests/unit/repo/test_imports.py``).

- ``driverkit``: the node driver on the simulator, claim builders, an in-memory claim source
  (``bench.driver.driver_bench``, ``bench.driver.driver_harness`` and the driver's unit tests).
- ``kubeapi``: an API server in memory behind the controller's ``request`` (``KubeWriter``'s API in the
  controller's unit tests).
- ``slicekit``: one node's ResourceSlices in memory behind the publisher's slice API
  (``bench.placement.steer_writes`` and the publisher's unit tests).
"""
