"""gpuplane on the e2e cluster: simulated GPU nodes, drivers, the kubelet stand-in, install, identities, demo.

Built on :mod:`e2e.cluster`; modules are listed in :mod:`e2e`.
"""
