"""Tests of :mod:`bench`'s pure parts: the entry point, result files, the fleet and placement helpers.

- ``test_bench_entry``: ``python -m bench``: the listing by subject, dispatch to a benchmark's ``main``, and its
  result file.
- ``test_docs_results``: bench.docs_results: a benchmark's --write-docs keeps the prose above the marker and
  replaces what follows.
- ``test_fleet``: The fleet harness's pure parts: the node plan, Node bodies, KWOK's stages, whole-GPU-only
  discovery.
- ``test_fleet_profile``: bench.fleet.fleet_profile: py-spy's raw stacks summarised by function, line numbers
  merged.
- ``test_kube_compare_latency``: bench.kube.kube_compare.added_latency: creation -> bound for the pods no mode kept
  waiting, with its gate part.
- ``test_kube_model``: The benchmark's model of kube-scheduler: scoring arithmetic, Go's heap tie-break, the
  allocator's walk.
- ``test_placement_bench_waits``: The placement benchmark's wait accounting: warm-start requests that had to queue,
  and waits by shape.
- ``test_rightsize_bench``: The right-sizing benchmark's pieces: the options a trace pod is offered, and the
  replay's MPS packing.
"""
