"""Right-sizing on the trace: fixed MIG profiles against GpuRequests.

- ``rightsize_bench``: the comparison and its tables (runnable).
- ``rightsize_replay``: one replay with right-sizing.
- ``rightsize_needs``: trace pods as needs, and each variant's options.
"""
