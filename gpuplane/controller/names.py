"""Names the controller owns: the GpuGang API, labels, the scheduling gate, annotations, reasons.

Device-facing names (driver name, attribute keys, the node label for the
NVLink domain) come from :mod:`gpuplane.api.names`; this module only adds the
controller's own vocabulary, so a user reading a pod or an Event can grep for
every string here.
"""

from __future__ import annotations

from gpuplane.api import names as driver_names

GROUP = "gpuplane.dev"
VERSION = "v1alpha1"
GANG_PLURAL = "gpugangs"
GANG_KIND = "GpuGang"
GANG_API_VERSION = f"{GROUP}/{VERSION}"

# A member pod carries the gang's name in this label, the gate below, and a
# resourceClaims entry whose resourceClaimName is ``claim_name(gang, index)``.
LABEL_GANG = "gpuplane.dev/gang"
SCHEDULING_GATE = "gpuplane.dev/gang"
STEER_GATE = "gpuplane.dev/steer"  # gate-and-steer's gate (steer.decide.Settings.gate, the admission policy's)
LABEL_MEMBER_INDEX = "gpuplane.dev/member-index"  # written by the controller on claims, informational on pods
NODE_LABEL_NVLINK_DOMAIN = driver_names.NODE_LABEL_NVLINK_DOMAIN
ANNOTATION_NVLINK_DOMAINS = "gpuplane.dev/nvlink-domains"  # all domains of a node with more than one

# Annotations the controller keeps on ResourceClaims (state in the API, never in memory).
ANNOTATION_DECISION = "gpuplane.dev/decision"
ANNOTATION_CONFIG_ERROR = "gpuplane.dev/config-error"
ANNOTATION_EXPLAINED = "gpuplane.dev/unallocated-reason"
ANNOTATION_DOMAIN_WARNING = "gpuplane.dev/nvlink-constraint-warning"

CLAIM_REQUEST = "gpus"
MATCH_ATTRIBUTE_DOMAIN = f"{driver_names.DRIVER_NAME}/{driver_names.ATTR_NVLINK_DOMAIN}"
DEFAULT_DEVICE_CLASS = "gpu.gpuplane.dev"
DEFAULT_MIG_DEVICE_CLASS = "mig.gpuplane.dev"

# Pod condition the claim validator sets on consumers of a claim with a bad opaque config.
POD_CONDITION_CLAIM_CONFIG = "gpuplane.dev/ClaimConfigValid"

COMPONENT = "gpuplane-controller"
LEASE_NAME = "gpuplane-controller"  # the coordination.k8s.io Lease the replicas elect a leader with
LEASE_NAMESPACE = "gpuplane-system"


def claim_name(gang: str, member: int) -> str:
    """The ResourceClaim member ``member`` of ``gang`` references (created only when the gang is placed)."""
    return f"{gang}-{member}"
