"""Which tier a namespace is entitled to, and which namespaces are never touched. Pure.

A sharing tier (the ``mps-<tier>`` / ``timeslice-<tier>`` DeviceClasses) is an entitlement an
administrator grants a namespace with the label :data:`MAX_TIER_LABEL` (``gold``, ``silver`` or
``bronze``: the highest tier its claims may use). Tenants cannot write Namespaces, so the label is
the administrator's word. The admission policy ``gpuplane-tier-entitlement``
(``manifests/policies/tier-entitlement.yaml``) refuses a claim above it; the rebalancer does not
take a claim's class on trust either (the claim may predate the policy, or the policy may be
off): a claim counts at most as its namespace's entitled tier.

An unlabelled namespace (or one whose label is not a tier) is entitled to :data:`DEFAULT_MAX_TIER`,
``bronze``: the lowest tier only ever *yields* to others (a bronze claim is never the reason
anybody is evicted), so a namespace nobody granted anything cannot harm another, while it can
still share GPUs.

System namespaces (:data:`SYSTEM_NAMESPACES`, and any labelled ``gpuplane.dev/system: "true"``)
are never evicted from.
"""

from __future__ import annotations

from collections.abc import Mapping

MAX_TIER_LABEL = "gpuplane.dev/max-tier"
SYSTEM_LABEL = "gpuplane.dev/system"
DEFAULT_MAX_TIER = "bronze"
TIERS = ("gold", "silver", "bronze")  # highest first
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "gpuplane-system"})

Labels = Mapping[str, str]


def max_tier(labels: Labels | None) -> str:
    """The highest tier a namespace with ``labels`` may use (the default when unlabelled or not a tier)."""
    value = (labels or {}).get(MAX_TIER_LABEL)
    return value if value in TIERS else DEFAULT_MAX_TIER


def entitled(tier: str, labels: Labels | None, ranks: Mapping[str, int]) -> str:
    """``tier`` as it counts: at most the namespace's entitled tier (an untiered claim stays untiered)."""
    if tier not in ranks:
        return tier
    cap = max_tier(labels)
    return cap if ranks.get(tier, 0) > ranks.get(cap, 0) else tier


def is_system(namespace: str, labels: Labels | None) -> bool:
    """Whether gpuplane must never evict from ``namespace``."""
    return namespace in SYSTEM_NAMESPACES or (labels or {}).get(SYSTEM_LABEL) == "true"
