"""The node driver: prepare/unprepare latency, memory, MIG and MPS.

- ``driver_bench``: prepare/unprepare latency against a measured floor, resident memory, MIG and
  MPS latency (runnable).
- ``driver_harness``: its harness (the driver in its own process, scratch directories).
"""
