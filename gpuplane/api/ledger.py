"""The cost ledger's record: one (claim, device) segment of constant fraction, one JSON line.

Written by the driver's accountant (:mod:`gpuplane.driver.observe.cost`, ``<plugin_dir>/cost-ledger.jsonl``)
and by the controller's rebalancer for a move (kind ``moved``, :mod:`gpuplane.controller.rebalance.moves`);
read by ``python -m gpuplane.driver.observe.cost summary``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Segment:
    """A ledger record: ``holding`` charged at a constant fraction from ``start`` to ``end``."""

    start: float
    end: float
    node: str
    claim_uid: str
    namespace: str
    name: str
    tier: str
    kind: str
    device: str
    fraction: float

    @property
    def gpu_seconds(self) -> float:
        return self.fraction * (self.end - self.start)

    def to_json(self) -> str:
        data = asdict(self)
        data["gpu_seconds"] = round(self.gpu_seconds, 6)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Segment:
        data = json.loads(line)
        fields = {k: data[k] for k in cls.__dataclass_fields__}
        return cls(**fields)
