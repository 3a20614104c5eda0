"""Tests of the repository itself rather than one package: import contracts, layout, package indexes,
the monitoring manifests (``rules/*.test.yaml``: promtool's alert tests), the benchmarks and the e2e harness.

- ``bench``: Tests of :mod:`bench`'s pure parts: the entry point, result files, the fleet and placement helpers.
- ``harness``: Tests of the e2e harness's pure parts (:mod:`e2e`: images, real nodes, the demo, chaos checks) and of
  the stand-ins for NVIDIA's binaries in ``tests/fakes``.
- ``test_imports``: The import direction of ``gpuplane``, enforced: the contracts ``docs/architecture.md`` lists.
- ``test_layout``: The repository layout: one import package, ``gpuplane``; top-level ``driver/`` and
  ``controller/`` only lead to it.
- ``test_monitoring_dashboard``: The Grafana dashboard, and every metric the dashboard and the alerting rules name
  is one the code exports.
- ``test_monitoring_rules``: gpuplane's alerting rules: ``promtool check rules`` and ``promtool test rules``, and
  their one source.
- ``test_package_indexes``: Package indexes: every package's ``__init__`` docstring names each of its modules and
  sub-packages.
"""
