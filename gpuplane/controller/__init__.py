"""gpuplane controller: a kopf operator for claims, gangs and NVLink-aware placement."""
