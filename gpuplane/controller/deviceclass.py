"""A DeviceClass as the controller reads it: parsed once, at the informer, into a typed, frozen view. Pure.

The class index (:mod:`gpuplane.controller.caches`) keeps a :class:`ClassView`, not the object: its name,
its CEL selectors (the claim checks, steering, gangs and the MIG filter compile them with a request's own),
the opaque parameters of this driver's config entries as written (the claim review merges them with a
claim's, right-sizing reads an MPS tier's limits from them), whether the class selects this driver's
devices at all (by a selector naming the driver, or by a config for it), and whether it selects MIG
devices. Total on any body: a field of the wrong type reads as absent.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.api import names as dn
from gpuplane.api.boundedjson import mapping, mappings

_MIG = re.compile(r'type\s*==\s*"mig"')


@dataclass(frozen=True, slots=True)
class ClassView:
    """A DeviceClass: what claim checks, steering, gangs and right-sizing read of it; read-only."""

    name: str
    selectors: tuple[str, ...] = ()  # spec.selectors[].cel.expression, in order
    # spec.config[].opaque.parameters of this driver's entries, as written (read-only: readers copy)
    configs: tuple[Mapping[str, Any], ...] = ()
    ours: bool = False  # it selects this driver's devices (a selector names the driver, or a config is for it)
    device_type: str = dn.DEVICE_TYPE_GPU  # ``mig`` when its selectors select MIG devices


def view(body: Mapping[str, Any]) -> ClassView:
    """The indexed form of a DeviceClass."""
    meta, spec = mapping(body.get("metadata")), mapping(body.get("spec"))
    exprs = tuple(str(mapping(s.get("cel")).get("expression", "")) for s in mappings(spec.get("selectors")))
    ours_configs = [
        mapping(c.get("opaque"))
        for c in mappings(spec.get("config"))
        if mapping(c.get("opaque")).get("driver") == dn.DRIVER_NAME
    ]
    name = meta.get("name")
    return ClassView(
        name=name if isinstance(name, str) else "",
        selectors=exprs,
        configs=tuple(copy.deepcopy(dict(mapping(o.get("parameters")))) for o in ours_configs),
        ours=dn.DRIVER_NAME in " ".join(exprs) or bool(ours_configs),
        device_type=dn.DEVICE_TYPE_MIG if _MIG.search(" ".join(exprs)) else dn.DEVICE_TYPE_GPU,
    )
