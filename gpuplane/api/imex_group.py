"""IMEX groups: hand-placed pods' claims that ask for one IMEX domain without a gang (``docs/imex.md``).

A tenant labels its ResourceClaims (directly, or through a ResourceClaimTemplate's ``metadata.labels``) with
``gpuplane.dev/imex-group: <name>``. The controller plans the allocated claims of one namespace carrying one
name like a gang (``gpuplane.controller.imex.groups``); the driver's prepare of a labelled claim waits until a
domain names it (``gpuplane.driver.prepare.imex_claims``). Both read the label's value through
:func:`group_named` (the driver by way of :func:`group_of`, on the claim it is given; the controller on the
label its claim index kept), so they agree on what is a group and what is refused.

The label is tenant input: a name that is not a DNS label (lowercase letters, digits and ``-``, at most
``MAX_GROUP_NAME`` characters) is refused and the claim is treated as unlabelled. A group is keyed by
namespace and name, so a tenant's group never holds another namespace's claims. Its entry in an
``ImexDomain`` carries a uid derived from both (:func:`group_uid`), which cannot collide with a gang's
(a Kubernetes uid is a UUID, never ``group-...``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

LABEL = "gpuplane.dev/imex-group"
MAX_GROUP_NAME = 63
UID_PREFIX = "group-"
GANG_LABEL = "gpuplane.dev/gang"  # gpuplane.controller.names.LABEL_GANG (a test checks): a gang member's claim
GANG_KIND = "GpuGang"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def validate(name: str) -> str:
    """ "" when ``name`` is a valid group name, else why not."""
    if not name:
        return f"label {LABEL} is empty; a group name is a DNS label"
    if len(name) > MAX_GROUP_NAME:
        return f"label {LABEL}: {len(name)} characters, at most {MAX_GROUP_NAME}"
    if not _NAME.match(name):
        shown = name[:MAX_GROUP_NAME]
        return f"label {LABEL}: {shown!r} is not a DNS label (lowercase letters, digits, '-', alphanumeric ends)"
    return ""


def in_gang(claim: Mapping[str, Any]) -> bool:
    """Whether the claim carries a gang's mark (the controller's member claims: its label, or a GpuGang owner):
    such a claim follows its gang, never a group. A template member's claim carries neither: the controller
    knows it from the member pod, the driver does not (see ``docs/imex.md``)."""
    meta = claim.get("metadata")
    if not isinstance(meta, Mapping):
        return False
    labels = meta.get("labels")
    if isinstance(labels, Mapping) and GANG_LABEL in labels:
        return True
    owners = meta.get("ownerReferences")
    return isinstance(owners, list) and any(isinstance(r, Mapping) and r.get("kind") == GANG_KIND for r in owners)


def group_of(claim: Mapping[str, Any]) -> tuple[str, str]:
    """(the claim's group name, "") or ("", why the label is refused); ("", "") when the claim has no label."""
    meta = claim.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping) or LABEL not in labels:
        return "", ""
    return group_named(labels[LABEL])


def group_named(value: object) -> tuple[str, str]:
    """:func:`group_of` for the label's value as written: (the group name, "") or ("", why it is refused)."""
    if not isinstance(value, str):
        return "", f"label {LABEL} must be a string"
    why = validate(value)
    return ("", why) if why else (value, "")


def group_uid(namespace: str, name: str) -> str:
    """The group's stable id in an ``ImexDomain`` (``group-`` + 32 hex digits of a hash of namespace and name)."""
    return UID_PREFIX + hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:32]


def is_group(uid: str) -> bool:
    """Whether an ``ImexDomain`` entry's uid is a group's (a gang's is its GpuGang's uid)."""
    return uid.startswith(UID_PREFIX)
