"""Benchmarks that print figures, grouped by subject (not installed with gpuplane).

One entry point, ``python -m bench`` (``bench/__main__.py``):

- ``python -m bench`` or ``python -m bench list``: every runnable benchmark by subject, one line each;
- ``python -m bench [--results DIR] NAME [ARGS...]``: runs benchmark ``NAME`` (its module's
  ``main(ARGS)``), printing live as before, and records the run in one result file (``result``) in
  ``DIR``, default ``bench-results/`` in the working directory (ignored by git).

``python -m bench.<subject>.<name>`` still runs a module directly, without a result file. A module keeps
its old name in its subject package (``fleet_scale`` is ``bench/fleet/fleet_scale.py``), so every name
is unique across subjects and is what ``python -m bench NAME`` takes. Ratios are measured side by side in
one run; results go into ``docs/`` (``docs_results``). The subjects, each indexed in its own package:

- ``driver``: the node driver's prepare/unprepare latency, memory, MIG and MPS.
- ``dra``: DRA on a real control plane, what GPU claims add to a pod's start.
- ``placement``: placement on the Alibaba GPU trace (2023, "openb"): the trace, policies against each
  other, a fragmentation bound, the steered layout's slice writes.
- ``kube``: the trace on the real control plane with kube-scheduler allocating, and a model of it.
- ``rightsize``: fixed MIG profiles against GpuRequests on the trace.
- ``gangs``: which NVLink domain each gang gets, and what the controller's gang and claim passes cost.
- ``fleet``: a 1,000-node KWOK fleet against the real scheduler, API server, etcd and controller, and
  the controller's memory on it.

And at the top level:

- ``result``: the one result format, a frozen ``Result`` stored as JSON (``write``, ``read``): the
  benchmark's name and argv, the git commit, the host's CPU count, the Kubernetes release if given
  (``GPUPLANE_KUBERNETES``), start and end (UTC, ISO 8601), the exit code, the lines it printed.
- ``docs_results``: a benchmark's ``--write-docs`` output written below a document's results marker.
"""
