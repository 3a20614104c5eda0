"""gpuplane node driver: a kubelet DRA plugin that shares and isolates GPUs.

It uses the shared layers (:mod:`gpuplane.api`, :mod:`gpuplane.placement`, :mod:`gpuplane.mig`,
:mod:`gpuplane.logs`) and never imports :mod:`gpuplane.controller` (``tests/unit/repo/test_imports.py``).

Packages, each with its own index (imports go downward: ``plugin`` knows nothing of NVML, and the
core, ``prepare``, ``sharing``, ``publish`` and ``observe``, never imports ``plugin``):

- ``plugin``: the kubelet-facing gRPC layer (registration, DRA, dra-health, grpc.health) over unix sockets.
- ``prepare``: prepare and unprepare, ``DeviceState`` (the transaction) and its steps.
- ``sharing``: one GPU between claims: per-claim MPS control daemons (``mps``, its parts
  ``mps_daemon``, ``mps_client``, ``mps_procs``, ``mps_spec``; ``mps_pods``: each daemon in a pod
  of its own) and the time-slice tiers (``timeslice_tiers``).
- ``publish``: discovery and the node's ResourceSlices.
- ``observe``: health, telemetry, noisy neighbours and cost while the GPUs run.
- ``inventory``: discovery, the hardware backend's answers turned into the node's device inventory
  (whole GPUs, MIG placements, NVLink domains, names); read by ``prepare`` and ``publish``.
- ``hw``: the hardware boundary (``GpuBackend``: NVML or the simulator, chosen by configuration).

The program around them:

- ``main``: ``gpuplane-driver``: configuration, hardware, API, state, slices and sockets wired together.
- ``config``: read once at start (flags, then environment) and passed in.
- ``kube``: the Kubernetes API access: one client, built once, and the few calls it makes.
- ``host``: the host's files and process table: atomic writes, file locks, ``/proc/<pid>`` read once.
- ``metrics``: the driver's Prometheus metrics (one registry, made in ``main`` and passed in).
- ``probes``: liveness and readiness, served beside ``/metrics`` for kubelet's probes.
"""
