"""Sharing one GPU between claims.

- ``mps``: :class:`mps.MpsControl`, per-claim MPS control daemons (start, configure, find again,
  stop), one claim's daemon at a time, serialized.
- ``mps_daemon``: one claim's daemon: creates and removes its directories under the plugin
  directory, writes its record, starts and stops the process.
- ``mps_client``: the control binary in client mode, and the read-back of every setting (runs it).
- ``mps_procs``: finds MPS daemons and servers in ``/proc`` (reads it) and signals them.
- ``mps_pods``: each claim's daemon in a pod of its own on the node (``--mps-daemons=pod``): the pod
  built from the driver's own (pure), and its create, read and delete through the API.
- ``backoff``: a deadline and a doubling pause, for the loops that wait on a daemon, a process or a pod.
- ``mps_spec``: the values (spec, paths, what containers get) and the spec checks; no I/O.

- ``imex_daemons``: this node's IMEX daemon: which should run for the ``ImexDomain`` listing the node,
  its config and node file, the step to take (start, reload, restart, stop), the restart backoff and the
  status entry to report; pure.
- ``imex_runner``: runs that daemon as the driver's child (``--imex-daemons=process``), asks it
  ``nvidia-imex-ctl -q`` and patches this node's entry of the domain's status (I/O).
- ``imex_pods``: that daemon in a pod of its own on the node (``--imex-daemons=pod``), outliving driver
  restarts: the pod (pure, sharing ``mps_pods``' template and skeleton), its create, adoption and delete.
- ``imex_watch``: the IMEX pod's entry point: runs ``nvidia-imex`` and sends it ``SIGUSR1`` when the driver
  rewrites the node file.

- ``timeslice_tiers``: which interval a time-sliced GPU gets and which tiers may share it; pure.

Time-slicing needs no daemon: ``DeviceState`` (:mod:`gpuplane.driver.prepare.state`) sets the
GPU's time-slice through the hardware backend.
"""
