"""The trace on the real control plane, kube-scheduler allocating, and a model of kube-scheduler to compare with.

- ``kube_replay``: the trace replayed on the real control plane, and recorded (runnable).
- ``kube_record``: the record: lifecycles from two watches, slice-write counters.
- ``kube_compare``: compares those records with ``kube_model`` (runnable).
- ``kube_layout``: a record's layout on the model's GPUs.
- ``kube_model``: a model of kube-scheduler v1.36 on gpuplane's slices.
- ``kube_walk``: the order kube-scheduler's DRA allocator meets a node's devices in.
"""
