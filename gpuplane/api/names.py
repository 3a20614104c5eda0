"""Names the driver publishes and the controller selects on: driver name, attribute keys, API group."""

from __future__ import annotations

DRIVER_NAME = "gpu.gpuplane.dev"
CONFIG_API_VERSION = "gpu.gpuplane.dev/v1alpha1"
CDI_VENDOR = "k8s.gpu.gpuplane.dev"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"

# Device attributes (unqualified names live in the driver's own domain:
# CEL reads them as device.attributes["gpu.gpuplane.dev"].<name>).
ATTR_TYPE = "type"
ATTR_UUID = "uuid"
ATTR_PRODUCT_NAME = "productName"
ATTR_BRAND = "brand"
ATTR_ARCHITECTURE = "architecture"
ATTR_CUDA_CC = "cudaComputeCapability"
ATTR_DRIVER_VERSION = "driverVersion"
ATTR_CUDA_DRIVER_VERSION = "cudaDriverVersion"
ATTR_NVLINK_DOMAIN = "nvlinkDomain"
ATTR_MINOR = "minor"
ATTR_MIG_CAPABLE = "migCapable"
ATTR_MIG_PROFILE = "migProfile"
ATTR_MIG_PLACEMENT = "migPlacement"
ATTR_PARENT_UUID = "parentUUID"
ATTR_PARENT_MINOR = "parentMinor"
ATTR_MIG_STATIC = "migStatic"
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

CAP_MEMORY = "memory"
CAP_MULTIPROCESSORS = "multiprocessors"
CAP_SHARE_PERCENT = "sharePercent"

DEVICE_TYPE_GPU = "gpu"
DEVICE_TYPE_MIG = "mig"

# Node label the controller keeps equal to the node's NVLink domain.
NODE_LABEL_NVLINK_DOMAIN = "gpuplane.dev/nvlink-domain"

IMEX_CHANNEL_COUNT = 2048
"""IMEX channels per node (``NVreg_ImexChannelCount``'s default): the controller hands out 1..2047 to gangs,
the driver makes the node of the one a claim gets; 0 is NVIDIA's default for everyone and never handed out."""
