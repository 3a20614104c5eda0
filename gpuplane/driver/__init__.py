"""gpuplane node driver: a kubelet DRA plugin that shares and isolates GPUs."""
