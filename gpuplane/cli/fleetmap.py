"""The fleet map: per node and GPU, what is whole, cut into which MIG layout, shared by whom, tainted, free.

Pure: gpuplane's ResourceSlices and the allocated ResourceClaims (plain API dicts, as ``kubectl get -o
json`` gives them) in, a :class:`Fleet` out, rendered as text lines with or without ANSI colour. What a
GPU holds is read from the devices' counter consumption: a device takes the ``memory-slice-<k>``
counters of its GPU's counter set (a MIG device its slices, the whole GPU all eight), so the map draws
one cell per memory slice without knowing any MIG table. A GPU published without counters (whole GPUs
only, ``--mig-placements=off``) is drawn as one block.

Free blocks are the published MIG placements (and the whole GPU) that no allocation overlaps: the
largest is what a new request could still get there, by the catalogue the scheduler allocates from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuplane.api import names
from gpuplane.api.boundedjson import mapping

_SLICE = re.compile(r"^memory-slice-(\d+)$")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVXYZ"
COLOURS = (31, 32, 33, 34, 35, 36, 91, 92, 93, 94, 95, 96)


@dataclass(frozen=True)
class Device:
    """One published device of gpuplane's driver."""

    name: str
    minor: int
    kind: str  # "gpu" or "mig"
    profile: str  # MIG profile ("" for a whole GPU)
    cells: frozenset[int]  # memory slices it takes ({} without counters)
    static: bool  # an administrator's MIG instance
    taints: tuple[str, ...]  # "key=value:Effect"
    product: str
    domain: str


@dataclass(frozen=True)
class Use:
    """One allocation of a device to a claim."""

    device: str
    claim: str  # namespace/name
    how: str  # "exclusive", "MPS gold 60 %", "time-slice silver", ...
    share: int  # percent of the device (100 when exclusive)
    sharing: str = "exclusive"  # "exclusive", "mps", "timeslice" or "shared" (a share without a tier class)
    tier: str = ""  # the sharing tier of an MPS or time-slice class ("gold", "silver", "bronze")

    @property
    def namespace(self) -> str:
        """The claim's namespace: the tenant."""
        return self.claim.split("/", 1)[0]


@dataclass
class Gpu:
    """One GPU of a node: its whole device, its MIG placements, what is allocated."""

    minor: int
    product: str = ""
    domain: str = ""
    whole: Device | None = None
    mig: list[Device] = field(default_factory=list)
    uses: list[Use] = field(default_factory=list)

    @property
    def devices(self) -> list[Device]:
        """Its published devices: the whole GPU first (when published), then its MIG placements."""
        return [*([self.whole] if self.whole else []), *self.mig]

    @property
    def cells(self) -> int:
        """Memory slices (8 on a MIG-capable GPU, 0 when published without counters)."""
        everything = set(self.whole.cells if self.whole else ())
        for d in self.mig:
            everything |= d.cells
        return max(everything) + 1 if everything else 0

    def taints(self) -> list[str]:
        """The taints of its devices (the whole GPU's, then any other)."""
        seen: list[str] = []
        for d in self.devices:
            seen += [t for t in d.taints if t not in seen]
        return seen

    def free_blocks(self) -> list[Device]:
        """Published devices no allocation overlaps, largest first (a shared whole GPU is not free)."""
        by_name = {d.name: d for d in self.devices}
        taken: set[int] = set()
        used_whole = False
        for use in self.uses:
            device = by_name.get(use.device)
            if device is None:
                continue
            taken |= device.cells
            used_whole |= device.kind == names.DEVICE_TYPE_GPU
        free = [
            d
            for d in by_name.values()
            if not (d.cells & taken) and not (used_whole and d.kind == names.DEVICE_TYPE_GPU)
        ]
        return sorted(free, key=lambda d: (-len(d.cells), d.kind != names.DEVICE_TYPE_GPU, -_compute(d), d.name))


def _compute(device: Device) -> int:
    """A MIG profile's compute slices (``3g.40gb`` -> 3); 0 for a whole GPU."""
    head = device.profile.split("g", 1)[0]
    return int(head) if head.isdigit() else 0


@dataclass
class Fleet:
    """Nodes -> minor -> GPU."""

    nodes: dict[str, dict[int, Gpu]] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)  # what RBAC kept from the reader


def _l(value: Any) -> list[Any]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def _attr(device: Mapping[str, Any], key: str) -> Any:
    value = mapping(mapping(device.get("attributes")).get(key))
    for kind in ("int", "string", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _cells(device: Mapping[str, Any]) -> frozenset[int]:
    cells: set[int] = set()
    for consumption in _l(device.get("consumesCounters")):
        for counter in mapping(mapping(consumption).get("counters")):
            match = _SLICE.match(str(counter))
            if match:
                cells.add(int(match.group(1)))
    return frozenset(cells)


def _taint(t: Mapping[str, Any]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key', '?')}{value}:{t.get('effect', '?')}"


def parse_device(device: Mapping[str, Any]) -> Device | None:
    """A published device, or None when it is not one of gpuplane's GPUs or MIG devices."""
    kind = _attr(device, names.ATTR_TYPE)
    minor = _attr(device, names.ATTR_MINOR if kind == names.DEVICE_TYPE_GPU else names.ATTR_PARENT_MINOR)
    if kind not in (names.DEVICE_TYPE_GPU, names.DEVICE_TYPE_MIG) or not isinstance(minor, int):
        return None
    return Device(
        name=str(device.get("name", "")),
        minor=minor,
        kind=str(kind),
        profile=str(_attr(device, names.ATTR_MIG_PROFILE) or ""),
        cells=_cells(device),
        static=bool(_attr(device, names.ATTR_MIG_STATIC)),
        taints=tuple(_taint(t) for t in _l(device.get("taints")) if isinstance(t, Mapping)),
        product=str(_attr(device, names.ATTR_PRODUCT_NAME) or ""),
        domain=str(_attr(device, names.ATTR_NVLINK_DOMAIN) or ""),
    )


def _how(class_name: str, share: int) -> str:
    """``mps-gold.gpu.gpuplane.dev`` -> ``MPS gold 60 %``; a whole-GPU or MIG class -> ``exclusive``."""
    sharing, tier = _sharing(class_name, share)
    if sharing in ("mps", "timeslice"):
        label = "MPS" if sharing == "mps" else "time-slice"
        return f"{label} {tier}" + (f" {share} %" if share < 100 else "")
    return "exclusive" if sharing == "exclusive" else f"shared {share} %"


def _sharing(class_name: str, share: int) -> tuple[str, str]:
    """(sharing, tier) of a device class: ``mps-gold.gpu.gpuplane.dev`` -> ("mps", "gold")."""
    head = class_name.split(".", 1)[0]
    if head.startswith(("mps-", "timeslice-")):
        what, tier = head.split("-", 1)
        return what, tier
    return ("exclusive", "") if share >= 100 else ("shared", "")


def _share(result: Mapping[str, Any], request: Mapping[str, Any]) -> int:
    consumed = mapping(result.get("consumedCapacity")).get(names.CAP_SHARE_PERCENT)
    asked = mapping(mapping(request.get("capacity")).get("requests")).get(names.CAP_SHARE_PERCENT)
    for value in (consumed, asked):
        if value is not None:
            try:
                return max(0, min(100, int(str(value))))
            except ValueError:
                continue
    return 100


def _requests(claim: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Request name (``req`` or, for ``firstAvailable``, ``req/sub``) -> what it asks for."""
    out: dict[str, Mapping[str, Any]] = {}
    for r in _l(mapping(mapping(claim.get("spec")).get("devices")).get("requests")):
        if not isinstance(r, Mapping):
            continue
        out[str(r.get("name"))] = mapping(r.get("exactly")) or r
        for sub in _l(r.get("firstAvailable")):
            if isinstance(sub, Mapping):
                out[f"{r.get('name')}/{sub.get('name')}"] = sub
    return out


def build(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]) -> Fleet:
    """The fleet from gpuplane's slices and the claims allocated on them."""
    fleet = Fleet()
    for s in slices:
        spec = mapping(mapping(s).get("spec"))
        node = spec.get("nodeName") or mapping(spec.get("pool")).get("name")
        if spec.get("driver") != names.DRIVER_NAME or not isinstance(node, str):
            continue
        gpus = fleet.nodes.setdefault(node, {})
        for raw in _l(spec.get("devices")):
            device = parse_device(raw) if isinstance(raw, Mapping) else None
            if device is None:
                continue
            gpu = gpus.setdefault(device.minor, Gpu(device.minor))
            gpu.product = gpu.product or device.product
            gpu.domain = gpu.domain or device.domain
            if device.kind == names.DEVICE_TYPE_GPU:
                gpu.whole = device
            else:
                gpu.mig.append(device)
    for claim in map(mapping, claims):
        meta = mapping(claim.get("metadata"))
        key = f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"
        requests = {
            r.get("name"): r.get("exactly") or r
            for r in (claim.get("spec") or {}).get("devices", {}).get("requests") or []
        }
        results = _l(mapping(mapping(mapping(claim.get("status")).get("allocation")).get("devices")).get("results"))
        for result in map(mapping, results):
            if result.get("driver") != names.DRIVER_NAME:
                continue
            gpus = fleet.nodes.get(str(result.get("pool")), {})
            request = requests.get(str(result.get("request", ""))) or {}
            share = _share(result, request)
            class_name = str(request.get("deviceClassName", ""))
            sharing, tier = _sharing(class_name, share)
            use = Use(str(result.get("device")), key, _how(class_name, share), share, sharing, tier)
            for gpu in gpus.values():
                if any(d.name == use.device for d in gpu.devices):
                    gpu.uses.append(use)
    return fleet


def _paint(text: str, colour: int | None, on: bool) -> str:
    return f"\x1b[{colour}m{text}\x1b[0m" if on and colour is not None else text


def render(fleet: Fleet, *, colour: bool = False) -> list[str]:
    """The map as lines: a header per node, a line per GPU (cells, owners, free blocks, taints)."""
    lines: list[str] = []
    for node in sorted(fleet.nodes):
        gpus = fleet.nodes[node]
        domains = sorted({g.domain for g in gpus.values() if g.domain})
        lines.append(f"{node}  ({len(gpus)} GPUs; NVLink domain {', '.join(domains) or '-'})")
        for minor in sorted(gpus):
            lines.append("  " + _gpu_line(gpus[minor], colour))
    lines += [f"hidden: {h}" for h in fleet.hidden]
    return lines


@dataclass(frozen=True)
class Owner:
    """One allocation as the map shows it: its letter and colour, what it holds, whose it is, how."""

    letter: str
    colour: int
    what: str  # MIG profile, or "whole GPU"
    claim: str
    how: str


@dataclass(frozen=True)
class GpuView:
    """What the map draws for one GPU, for any renderer (text here, HTML in ``fleethtml``)."""

    name: str
    product: str
    cells: tuple[tuple[Owner | None, bool], ...]  # per memory slice: its owner (None: free), shared or not
    free: str
    owners: tuple[Owner, ...]
    static: tuple[str, ...]
    taints: tuple[str, ...]


def view(gpu: Gpu) -> GpuView:
    """The GPU's cells, owners, free block, administrators' MIG and taints."""
    letters: dict[str, tuple[str, int]] = {}
    for use in gpu.uses:
        if use.claim not in letters:
            n = len(letters)
            letters[use.claim] = (LETTERS[n % len(LETTERS)], COLOURS[n % len(COLOURS)])
    by_name = {d.name: d for d in gpu.devices}
    size = gpu.cells or 1
    cells: list[tuple[Owner | None, bool]] = [(None, False)] * size
    owners: list[Owner] = []
    shared_so_far = 0  # percent of the GPU drawn for shares: each share gets its part of the cells, in order
    for use in gpu.uses:
        letter, col = letters[use.claim]
        device = by_name.get(use.device)
        taken: Sequence[int] = sorted(device.cells) if device and device.cells else range(size)
        shared = device is not None and device.kind == names.DEVICE_TYPE_GPU and use.share < 100
        if shared:
            first = round(min(100, shared_so_far) * size / 100)
            shared_so_far += use.share
            taken = range(first, round(min(100, shared_so_far) * size / 100))
        what = device.profile if device and device.profile else "whole GPU"
        owner = Owner(letter, col, what, use.claim, use.how)
        for k in taken:
            cells[k] = (owner, shared)
        owners.append(owner)
    whole_uses = [u for u in gpu.uses if u.device in by_name and by_name[u.device].kind == names.DEVICE_TYPE_GPU]
    shares = [u.share for u in whole_uses if u.share < 100]
    free = gpu.free_blocks()
    if shares:
        free_text = f"free share {100 - sum(shares)} %"
    elif free:
        best = free[0]
        free_text = "free: whole GPU" if best.kind == names.DEVICE_TYPE_GPU else f"largest free: {best.profile}"
        if best.kind != names.DEVICE_TYPE_GPU and best.cells:
            free_text += f" @{min(best.cells)}"
    else:
        free_text = "full"
    return GpuView(
        name=gpu.whole.name if gpu.whole else f"gpu-{gpu.minor}",
        product=gpu.product.removeprefix("NVIDIA "),
        cells=tuple(cells),
        free=free_text,
        owners=tuple(owners),
        static=tuple(d.profile for d in gpu.mig if d.static),
        taints=tuple(gpu.taints()),
    )


def _gpu_line(gpu: Gpu, colour: bool) -> str:
    v = view(gpu)
    cells = [
        _paint(".", None, colour) if owner is None else _paint("s" if shared else owner.letter, owner.colour, colour)
        for owner, shared in v.cells
    ]
    owners = [f"{_paint(o.letter, o.colour, colour)}={o.what} {o.claim} ({o.how})" for o in v.owners]
    parts = [f"{v.name:<7} {v.product[:16]:<16} [{' '.join(cells)}]", v.free, *owners]
    if v.static:
        parts.append(f"admin MIG: {', '.join(v.static)}")
    if v.taints:
        parts.append(_paint("taint " + ", ".join(v.taints), 31, colour))
    return "  ".join(parts)


def summary(fleet: Fleet) -> Sequence[str]:
    """Totals: GPUs whole and free, cut by MIG, shared, tainted."""
    gpus = [g for node in fleet.nodes.values() for g in node.values()]
    used = [g for g in gpus if g.uses]
    mig = [g for g in used if any(u.device != (g.whole.name if g.whole else "") for u in g.uses)]
    shared = [g for g in used if any(u.share < 100 for u in g.uses)]
    tainted = [g for g in gpus if g.taints()]
    whole = len(used) - len(mig) - len(shared)
    return [
        f"{len(fleet.nodes)} nodes, {len(gpus)} GPUs: {len(gpus) - len(used)} free, {whole} held whole, "
        f"{len(mig)} cut by MIG, {len(shared)} shared (MPS or time-slice), {len(tainted)} tainted"
    ]
