"""gpuplane's tests: ``tests/unit`` (fast, always run) and ``tests/e2e`` (a real control plane, opt-in with ``--e2e``).

What the test modules share lives here, one kit per subject (what the benchmarks use as well lives in
the top-level ``testing`` package, so that ``bench`` never imports ``tests``):

- ``conftest``: the suite's switches (``--e2e`` / ``GPUPLANE_E2E=1``).
- ``crashkit``: the driver as its own process (``crash_worker``), a node seen from kubelet's side.
- ``migkit``: the GPU models under test and prepare/unprepare with read-backs, for the MIG rules.
- ``mpskit``: the stand-in MPS control binary (``tests/fakes``), ids, the leak-checking ``root`` fixture.
- ``fakes/``: stand-ins for NVIDIA's binaries: ``nvidia-cuda-mps-control``, ``nvidia-imex`` and
  ``nvidia-imex-ctl`` (an IMEX domain on loopback addresses; ``tests/unit/repo/harness/test_imex_standin.py``).
- ``pluginkit``: a table-driven preparer and the plugin server on short socket paths.
- ``controllerkit``: the ResourceSlices the real driver publishes, DeviceClasses, gangs, pods, claims;
  ``templatekit`` gangs whose pods come from a template (Jobs); ``indexkit`` the controller's
  slice index over a small fleet.
- ``slicerules``: resource.k8s.io/v1's ResourceSlice validation rules, restated.
- ``hostile`` and ``strategies``: hostile inputs (deep JSON; hypothesis strategies for configs,
  claims, gangs); ``hostilekit`` what the hostile-input e2e modules share.
- ``rbackit``: fixtures of the least-privilege e2e tests.
- ``browserkit``: headless Chromium screenshots and a PNG reader, for the fleet map's HTML.
- ``hosttools``: programs from Debian's packages some tests need (promtool, prometheus, chromium): skip, or fail in CI.
- ``daemonpods``: MPS daemon pod bodies as ``--mps-daemons=pod`` makes them, for the pod-policy tests, and
  helpers that tell a refusal by the policy from one by RBAC.
- ``supervisor_worker``: a controller process with a misbehaving operator, for ``test_supervisor``.
"""
