"""Tests of the e2e harness's pure parts (:mod:`e2e`: images, real nodes, the demo, chaos checks)
and of the stand-ins for NVIDIA's binaries in ``tests/fakes``.

- ``test_chaos_imex``: The chaos e2e's IMEX invariants (``e2e.plane.chaos_imex``): a consistent reading passes, and
  each can fail.
- ``test_chaos_invariants``: The chaos e2e's invariant checks (e2e.plane.chaos_invariants.check) find each kind of
  violation they claim to.
- ``test_demo_components``: The demo's account of how each of gpuplane's programs runs
  (``e2e.plane.realnode.demo_real.component_lines``).
- ``test_demo_verdict``: The demo's verdict: each example against the state it exists to show; the order that keeps
  examples independent.
- ``test_e2e_order``: The e2e modules that install the base manifests on the session's control plane run before its
  gpu_cluster.
- ``test_image_build``: e2e.images: the cache key, the Dockerfile parsing, the archive naming and the builder's
  errors.
- ``test_imex_standin``: The ``nvidia-imex`` and ``nvidia-imex-ctl`` stand-ins (tests/fakes): a three-node IMEX
  domain on loopback.
- ``test_objectsets``: e2e.plane.objectsets: what the kustomize/helm comparison ignores, and that it catches
  everything else.
- ``test_previous_version``: N-1's tree: exported from a commit of a real git repository with git archive, once;
  clear errors otherwise.
- ``test_realinstall``: The local overlay's install on real nodes: per-node names, the root substituted, the
  generated kustomization.
- ``test_realinstall_compat``: An install of a version older than the real-node fixes: which commits need it, and
  the patches it gets.
- ``test_realnode_config``: The pure parts of e2e.cluster.realnode: OCI layout archives, names and subnets, configs,
  mount and cgroup parsing.
- ``test_simnode_imex``: The e2e cluster's simulated GB200 trays run their IMEX daemons (the stand-ins), on one peer
  port per cluster.
"""
