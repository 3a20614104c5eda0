"""Right-sizing: a GpuRequest (memory, compute share, isolation, tier) becomes a ResourceClaimTemplate.

- ``need``: the GpuRequest as read (``RequestView``) and its spec parsed and checked; pure.
- ``fleet``: GPU models, MIG profiles and MPS tier limits read from ResourceSlices and DeviceClasses; pure.
- ``alternatives``: the right-sizing rule, need + fleet -> ordered DRA alternatives; pure.
- ``template``: the ResourceClaimTemplate (``firstAvailable``) and the GpuRequest status; pure.
- ``decide``: one GpuRequest's writes (template replace, status, Event); pure.
- ``apply``: carries a decision out through the controller's writer; does I/O.
"""
