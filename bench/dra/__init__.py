"""DRA on a real control plane: what GPU claims add to a pod's start.

- ``dra_overhead``: apply-to-Running of pods with GPU claims next to the same pods without (runnable).
- ``dra_setup``: its objects (the DeviceClass, claim templates, pods).
- ``dra_watch``: its watches on pods and claims.
- ``dra_stages``: where each pod's time went (``--stages``).
"""
