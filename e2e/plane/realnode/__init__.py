"""Real nodes in the e2e cluster: kubelet v1.36 and containerd 2.x per node, and gpuplane's driver on each.

Built on :mod:`e2e.cluster.realnode` (the generic machinery):

* ``plan``: a cluster's real nodes, their directories, ports, subnets and the names of what they make;
* ``commands``: the processes' command lines (the driver's on the simulator) and environments;
* ``readiness``: when a node is usable (Node Ready by kubelet, driver registered, slices published);
* ``nodes``: ``RealNodes`` (start, stop, restart of driver or kubelet), ``stop_nodes`` (``down``),
  ``import_archive`` (an image archive into every real node's containerd);
* ``teardown``: taking a node off the machine again, and what is left of it;
* ``inspect``: what a running container got (env, device nodes, mounts), read from its process;
* ``demo_real``: the demo on real nodes (simulated nodes of the same profiles cordoned while the
  examples are placed) and what each container that uses a claim saw;
* ``cli``: ``--real-nodes`` of ``python -m e2e up/demo``.
"""
