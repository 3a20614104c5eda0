"""Hardware boundary: the GpuBackend protocol and its NVML and simulator implementations."""
