"""gpuplane: GPU sharing, isolation and placement for Kubernetes through Dynamic Resource Allocation.

One import package with three programs:

- :mod:`gpuplane.driver`: the node driver (``gpuplane-driver``), a kubelet DRA plugin;
- :mod:`gpuplane.controller`: the operator (``gpuplane-controller``);
- :mod:`gpuplane.cli`: the kubectl plugin (``kubectl-gpuplane``) for operators and tenants;

and the shared layers both of them use, which import neither program:

- :mod:`gpuplane.placement`: the pure placement module (request + immutable snapshot -> decision; no I/O);
- :mod:`gpuplane.api`: names, attributes, configuration models and record formats the two agree on;
- :mod:`gpuplane.mig`: the MIG geometry (pure: no Kubernetes, no I/O);
- :mod:`gpuplane.httpauth`: the authenticated ``/metrics`` server both of them serve (TokenReview,
  SubjectAccessReview, TLS, a bounded thread server);
- :mod:`gpuplane.logs`: structlog configured once, at start, by each binary's ``main``;
- :mod:`gpuplane.informer`: list-and-watch informers, their indexes and work queues (the controller's reads).

The direction is enforced by ``tests/unit/repo/test_imports.py``: the programs never import each other,
the shared layers import no program, ``placement`` and ``mig`` import no Kubernetes client, and
nothing imports a private module of a dependency (kopf's internals included).

The repository's top-level ``driver/`` and ``controller/`` are symbolic links to these two
packages. Import them as ``gpuplane.driver`` and ``gpuplane.controller`` only (ruff's banned-api
rule and ``tests/unit/repo/test_layout.py`` refuse the bare names, which would load every module twice).
"""
