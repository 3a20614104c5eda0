"""Real nodes' machinery, generic (nothing of gpuplane): a real kubelet and containerd per node, on this machine.

* ``host``: what the machine must offer (root, capabilities, cgroups, Debian packages);
* ``binaries``: kubelet (from ``e2e/cluster/k8sbuild``), containerd/ctr/shim and pause
  (``e2e/cluster/nodebuild``), built once and cached by version;
* ``oci``, ``images``: the pause and busybox images, packed offline as OCI layout archives;
* ``network``, ``cgroups``: a node's bridge, subnet and CNI config; its cgroup root;
* ``containerd``, ``kubeletconf``: the runtime's and kubelet's configuration; image import;
* ``mounts``: unmounting what a node mounted.

:mod:`e2e.plane.realnode` puts gpuplane's driver on such nodes and runs them.
"""
