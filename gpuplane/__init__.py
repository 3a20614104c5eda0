"""gpuplane: GPU sharing, isolation and placement for Kubernetes through Dynamic Resource Allocation.

One import package with two programs:

- :mod:`gpuplane.driver`: the node driver (``gpuplane-driver``), a kubelet DRA plugin;
- :mod:`gpuplane.controller`: the operator (``gpuplane-controller``) and the pure placement module;
- :mod:`gpuplane.mig`: the MIG geometry both of them use (pure: no Kubernetes, no I/O).
- :mod:`gpuplane.httpauth`: the authenticated ``/metrics`` server both of them serve (TokenReview,
  SubjectAccessReview, TLS, a bounded thread server).

The repository's top-level ``driver/`` and ``controller/`` are symbolic links to these two
packages. Import them as ``gpuplane.driver`` and ``gpuplane.controller`` only (ruff's banned-api
rule and ``tests/unit/test_layout.py`` refuse the bare names, which would load every module twice).
"""
