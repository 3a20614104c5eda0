"""The driver's crash-safe record of what it prepared on this node.

File format: a header line ``gpuplane-checkpoint v<N> sha256=<hex>\\n`` followed by
the JSON payload. The checksum is computed over the payload *bytes as stored*,
never over re-marshalled JSON, so adding fields in a later version cannot make
an old file look corrupt. Reads ignore unknown fields; writes go to a temp file,
fsync, rename, fsync the directory.

The record is two-phase per claim: ``PrepareStarted`` is written before any
hardware is touched (with the intended MIG placements), ``PrepareCompleted``
after the CDI spec is verified. A boot id ties the record to one boot: after a
reboot no MIG instance or MPS daemon survives, so prepared state is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field

from gpuplane.driver.host import atomic_write

log = structlog.get_logger(__name__)

CHECKPOINT_VERSION = 2
_MAGIC = b"gpuplane-checkpoint"

ClaimPhase = Literal["PrepareStarted", "PrepareCompleted"]


class _Tolerant(BaseModel):
    model_config = ConfigDict(extra="ignore")


class MigRecord(_Tolerant):
    """A MIG instance a claim uses: the intended placement, then the real ids once made."""

    parent_uuid: str
    profile_id: int
    profile_name: str
    start: int
    size: int
    gi_id: int | None = None
    ci_id: int | None = None
    mig_uuid: str | None = None
    gi_caps_minor: int | None = None  # /dev/nvidia-caps/nvidia-cap<N> of the GPU instance
    ci_caps_minor: int | None = None  # ... and of its compute instance
    created_by_driver: bool = True  # False: an administrator's instance we only used


class DeviceRecord(_Tolerant):
    request_names: list[str]
    pool: str
    device: str
    kind: Literal["gpu", "mig"]
    gpu_uuid: str
    gpu_minor: int
    cdi_ids: list[str] = Field(default_factory=list)
    mig: MigRecord | None = None
    share_id: str | None = None


class SharingRecord(_Tolerant):
    strategy: str = "Exclusive"
    timeslice_interval: str | None = None
    timeslice_share_lower: bool = False  # the class lets lower tiers share its GPUs
    mps_active_thread_percentage: int | None = None
    mps_pinned_limits: dict[str, int] = Field(default_factory=dict)  # device uuid -> bytes
    mps_client_priority: int | None = None  # CUDA_MPS_CLIENT_PRIORITY: 0 normal, 1 below normal


class ClaimRecord(_Tolerant):
    uid: str
    namespace: str
    name: str
    phase: ClaimPhase
    devices: list[DeviceRecord] = Field(default_factory=list)
    sharing: SharingRecord = Field(default_factory=SharingRecord)
    mps_daemon: bool = False
    cdi_spec: str | None = None
    updated_at: float = Field(default_factory=time.time)
    imex_channel: int | None = None  # the gang's IMEX channel on this node (issue 35), given at prepare
    imex_domain: str | None = None  # ... and the ImexDomain that gave it


class OwedMig(_Tolerant):
    """A MIG instance an unprepare could not destroy because its GPU did not answer (fell off the bus).

    Kept until the GPU answers again and the instance is destroyed (or found gone: a reset or a
    reboot wipes it); the GPU offers nothing new before that (:mod:`gpuplane.driver.prepare.owed`).
    """

    parent_uuid: str
    profile_id: int
    profile_name: str
    start: int
    size: int
    gi_id: int | None = None  # None: the prepare had recorded its intent, not yet the instance's id
    claim: str = ""  # namespace/name (uid) of the claim that made it
    since: float = Field(default_factory=time.time)


class Checkpoint(_Tolerant):
    version: int = CHECKPOINT_VERSION
    boot_id: str = ""
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)
    owed_mig: list[OwedMig] = Field(default_factory=list)


class CheckpointCorrupt(Exception):
    """The file on disk failed its integrity check or could not be parsed."""


def _migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring an older payload to the current schema (v1 stored claims as a list)."""
    version = int(raw.get("version", 1))
    if version < 2:
        claims = raw.get("claims", [])
        if isinstance(claims, list):
            raw["claims"] = {c["uid"]: c for c in claims if isinstance(c, dict) and "uid" in c}
        for claim in raw["claims"].values():
            if "state" in claim and "phase" not in claim:
                claim["phase"] = claim.pop("state")
        raw["version"] = 2
    return raw


def encode(checkpoint: Checkpoint) -> bytes:
    payload = checkpoint.model_dump_json(indent=None).encode()
    digest = hashlib.sha256(payload).hexdigest()
    return _MAGIC + f" v{checkpoint.version} sha256={digest}\n".encode() + payload


def decode(data: bytes) -> Checkpoint:
    header, sep, payload = data.partition(b"\n")
    if not sep or not header.startswith(_MAGIC):
        raise CheckpointCorrupt("missing checkpoint header")
    fields = dict(part.split("=", 1) for part in header.decode(errors="replace").split()[2:] if "=" in part)
    expected = fields.get("sha256")
    actual = hashlib.sha256(payload).hexdigest()
    if expected != actual:
        raise CheckpointCorrupt(f"checksum mismatch (header {expected}, content {actual})")
    try:
        raw = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise CheckpointCorrupt(f"payload is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointCorrupt("payload is not an object")
    return Checkpoint.model_validate(_migrate(raw))


@dataclass
class LoadResult:
    checkpoint: Checkpoint
    corrupt: bool = False
    boot_changed: bool = False
    dropped_claims: tuple[str, ...] = ()


class CheckpointStore:
    """Reads and atomically writes the checkpoint file."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id

    def load(self) -> LoadResult:
        """Read the checkpoint; survive corruption and reboots instead of failing."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return LoadResult(Checkpoint(boot_id=self.boot_id))
        try:
            checkpoint = decode(data)
        except (CheckpointCorrupt, ValueError) as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            log.error(
                "checkpoint corrupt; moved aside and rebuilding from the API",
                path=str(self.path),
                moved_to=str(aside),
                error=str(exc),
            )
            return LoadResult(Checkpoint(boot_id=self.boot_id), corrupt=True)
        if checkpoint.boot_id != self.boot_id:
            dropped = tuple(checkpoint.claims)
            if dropped:
                log.warning(
                    "node rebooted since the checkpoint was written; prepared state is gone",
                    old_boot_id=checkpoint.boot_id,
                    boot_id=self.boot_id,
                    dropped_claims=len(dropped),
                )
            return LoadResult(Checkpoint(boot_id=self.boot_id), boot_changed=True, dropped_claims=dropped)
        return LoadResult(checkpoint)

    def save(self, checkpoint: Checkpoint) -> None:
        checkpoint.boot_id = self.boot_id
        checkpoint.version = CHECKPOINT_VERSION
        atomic_write(self.path, encode(checkpoint))


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown-boot"
