"""End-to-end harness: a real Kubernetes control plane on loopback, without Docker, and gpuplane on it.

Three packages: ``plane`` built on ``cluster`` (nothing in ``cluster`` imports ``plane``), and
``images``, which needs neither but the cache root of ``cluster.build``:

``e2e.cluster``: a generic Kubernetes cluster, nothing gpuplane-specific.

- ``releases``: the supported Kubernetes releases (1.37 default, 1.36), each one's Go module, feature
  gates and API versions; ``GPUPLANE_KUBERNETES`` picks one for a run (the one place naming the version).
- ``build``: builds (once) and caches etcd and the Kubernetes binaries from the
  pinned Go module of the selected release in ``e2e/cluster/k8sbuild/v<minor>``; ``ensure_built`` does the same for any
  pinned Go module.
- ``kwok``: the KWOK controller (built from ``e2e/cluster/kwokbuild``), which keeps
  labelled Node objects Ready and marks their pods Running, without kubelets.
- ``pki``: the certificates, keys and kubeconfigs the control plane needs.
- ``procs``: starting, pidfile-tracking and stopping of component processes.
- ``controlplane``: etcd, kube-apiserver, kube-controller-manager and
  kube-scheduler started in order and awaited, and upgraded in place to another release's build
  (``ControlPlane.upgrade``); ``flags`` their command lines (feature gates, API versions, ports,
  certificates); ``readyz`` how each is asked whether it serves.
- ``handle``: ``Cluster``, a handle on a running cluster (kubeconfig, kubectl, API client).
- ``addon_build``: builds (once) and caches workload controllers (JobSet, LeaderWorkerSet) from
  their pinned Go modules in ``e2e/cluster/addonbuild``, with the manifests of the same release.
- ``addons``: one such controller on the cluster: CRDs, its upstream ClusterRole, loopback webhooks.
- ``realnode``: the machinery of real nodes (kubelet + containerd on this machine): host checks,
  node binaries (``e2e/cluster/nodebuild``), offline OCI images, bridges, cgroups, configs, mounts.

``e2e.plane``: gpuplane on that cluster.

- ``nodes``: Node objects kept Ready by a heartbeat, standing in for kubelets; the ``--nodes`` spec.
- ``kubelet``: the kubelet stand-in, run as ``python -m e2e.plane.kubelet``: one thread per pod;
  its parts ``kubelet_plugins`` (plugin registration), ``kubelet_dra`` (a pod's claims,
  prepare/unprepare, the CDI check), ``kubelet_pods`` (the pod watch, the Running status,
  Events) and ``standin_health`` (its side of the dra-health stream).
- ``realnode``: real nodes (a real kubelet and containerd each) with a ``gpuplane-driver``, their
  teardown, and what their containers got (``inspect``).
- ``driverproc``: one ``gpuplane-driver`` process on the simulator, for tests.
- ``simnodes``: simulated GPU nodes, a driver plus a kubelet stand-in per node, started, awaited
  and stopped; ``simnode_plan`` their plan (names, directories, sockets, NVL72 racks, ``nodes.json``).
- ``fleet``: a fleet of KWOK nodes (HGX H100, GB200 NVL72 racks) for scale tests.
- ``fleetslices``: the fleet's ResourceSlices, published by the driver's own discovery and
  publisher for many nodes in one process, each under its node's driver identity.
- ``identity``: the driver's and the controller's ServiceAccount identities (TokenRequest).
- ``install``: rendering and applying ``manifests/``, CRD storage migration.
- ``components``: gpuplane installed from ``manifests/overlays/e2e``, the drivers' credentials
  and the ``gpuplane-controller`` replicas.
- ``legacynode``: a node served by the NVIDIA device plugin (``nvidia.com/gpu`` in its capacity, no DRA driver).
- ``report``: what happened to a pod's claims, read back from the API and the node.
- ``demo``: apply every example and print where each pod landed.
- ``fleetpage``: headless Chromium's command line for a screenshot of the fleet map's page (demo and tests).
- ``demo_verdict``: whether each example reached its expected state (the demo's exit status), with next steps.
- ``helm``: helm built (once) from its Go module and cached by version; ``helm template`` /
  ``helm lint`` of ``charts/gpuplane``.
- ``objectsets``: two rendered object sets (kustomize's and helm's) compared after removing what
  legitimately differs between the tools; pure.
- ``plan_files``: what the simulated-node and real-node plans share (labels, GB200 racks, short
  socket roots, the plan file).
- ``access_review``: SubjectAccessReviews for an identity, one at a time or a whole intended matrix.
- ``realinstall``: gpuplane installed on real nodes as an operator does (images in each containerd,
  ``kubectl apply -k`` of ``manifests/overlays/local`` plus one listed delta); ``realinstall_compat``
  the patches an install of a version older than the first real-node fixes needs; ``podinstall``
  the flow on top (images imported, the install applied, rolled out, recorded) that ``up``, the
  demo and the real-node tests use: the driver DaemonSet's and the controller Deployment's pods.
- ``bringup``: ``python -m e2e up``'s steps (control plane, install, simulated nodes, controllers,
  addons) and ``stop_all``.
- ``chaos``: fault injection (SIGKILL a component, start it again, wait until it answers);
  ``chaos_load`` the churning workload of whole-GPU, MIG and MPS pods; ``chaos_invariants`` what
  must hold once the cluster is quiet, the API against each node's own state; ``chaos_imex`` the IMEX
  gangs churned across the GB200 trays and the IMEX invariants.
- ``imex_gangs``: hand-written IMEX GpuGangs on GB200 trays (objects), a tray's IMEX daemons and the
  channel device nodes of a CDI spec, shared by the IMEX and chaos tests.

``e2e.images``: gpuplane's container images, built here from the project's own Dockerfiles
(buildah, an offline Python base from Debian's packages, OCI archives cached by hash); its
modules are listed in :mod:`e2e.images`.

``__main__``: the ``python -m e2e`` command line (build, images, up, down, status, demo).
"""
