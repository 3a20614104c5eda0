"""Hardware boundary: the GpuBackend protocol and its NVML and simulator implementations.

- ``interface``: the :class:`interface.GpuBackend` protocol and the values it speaks; no I/O.
- ``select``: configuration chooses the implementation (the one place that does).
- ``nvml``: the real backend on nvidia-ml-py (lifecycle, inventory, time-slicing), with its parts
  ``nvml_session`` (lock, error translation), ``nvml_mig`` (MIG) and ``nvml_health`` (events,
  samples); changes the GPU only where the protocol asks it to.
- ``sim``: the NVML-faithful simulator (the GpuBackend calls), with its parts ``sim_config``
  (configuration, deterministic UUIDs; pure), ``sim_store`` (the state file and its lock, read
  fresh on every call) and ``sim_controls`` (reset, reboot, injected events, processes and
  telemetry); ``sim_profiles`` the node profiles it simulates; ``sim_cli`` the command that
  injects faults; ``sim_devnodes`` the placeholder device nodes (``/dev/nvidia*`` numbers) under
  its state directory, for a real container runtime (writes them).
- ``caps``: /dev/nvidia-caps minors of MIG instances; pure.
"""
