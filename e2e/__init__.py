"""End-to-end harness: a real Kubernetes control plane on loopback, without Docker.

Modules, each importing only downward:

- ``build``: builds (once) and caches etcd and the Kubernetes binaries from the
  pinned Go module in ``e2e/k8sbuild``.
- ``pki``: the certificates, keys and kubeconfigs the control plane needs.
- ``procs``: starting, pidfile-tracking and stopping of component processes.
- ``controlplane``: etcd, kube-apiserver, kube-controller-manager and
  kube-scheduler wired together.
- ``nodes``: Node objects kept Ready by a heartbeat, standing in for kubelets.
- ``cluster``: a handle on a running cluster (kubeconfig, kubectl, API client).
- ``__main__``: the ``python -m e2e`` command line (build, up, down).
"""
