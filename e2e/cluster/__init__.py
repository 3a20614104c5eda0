"""A generic Kubernetes cluster on loopback: binaries built from the Go module, PKI, processes, control plane.

Nothing here knows about gpuplane; :mod:`e2e.plane` runs gpuplane on it. Modules are listed
in :mod:`e2e`.
"""
