"""Which claim prepared on this node gets an IMEX channel: the controller's ``ImexDomain`` objects, read at prepare.

A tenant writes its claims and pods, so nothing on a claim can give it a channel (it would name another
gang's). Only the controller writes ``ImexDomain`` objects (in ``gpuplane-system``; tenants get no RBAC
there), and a claim gets a channel only when one of them names it on this node
(:func:`gpuplane.api.imex.claims_on`). The objects are listed afresh for each claim prepared on a GPU whose
multi-node NVLink is up (:attr:`gpuplane.driver.inventory.GpuEntry.multi_node`: its NVLink domain is a fabric
clique; one API read in one namespace), so such a prepare sees the controller's latest plan. A claim on
other GPUs (an HGX node, a tray whose fabric is down) can be in no domain (the controller forms them from
the GPUs' cliques only): it is prepared without the read, so a failing read (the API, the Role
``gpuplane-driver-imex``) fails only the prepares IMEX can apply to, retryably.

Every object is parsed with the strict shared parser; one it refuses is logged (once per name and
generation) and ignored whole, never half-read: a hostile or garbled object cannot crash the driver or give
a claim a channel. A claim two domains name, or on a node two domains list, gets none and its prepare fails
with why (:class:`ImexRefused`); kubelet retries it, and the controller's next pass repairs the plan.

**Readiness.** A named claim's prepare fails retryably (:class:`ImexWait`, naming the nodes) until every node
of its domain reports its daemon ready for the domain's current spec (``status.nodes[]``: ``ready`` and
``observedGeneration`` >= ``metadata.generation``). The daemons that will report it are not built yet
(``docs/imex.md``), so the wait applies only once a domain has any status (``require_status=False``, the
default); with the daemons in place it must apply from the start (``require_status=True``), or a prepare
that comes before the first report goes through unwaited.

**IMEX groups** (hand-placed pods without a gang, ``docs/imex.md``). A claim labelled
``gpuplane.dev/imex-group`` with a valid name (:func:`gpuplane.api.imex_group.group_of`; an invalid one is
treated as no label: the controller tells the claim why) has no gang whose gates order it after the plan, so
this wait is its ordering: while no domain names it, its prepare fails retryably (:class:`ImexWait`, saying it
waits for the group's IMEX domain) for at most ``Settings.group_wait_s`` from the first such prepare this driver
saw (kept in memory: a restarted driver waits afresh). Past that bound the claim is prepared **without** a
channel, logged, and told on the claim (``on_unwaited``; Event ``ImexGroupNoDomain``): its group's claims are
on one node (no IMEX needed), the controller refused the group (its Event on the claim says why) or runs no
plan. Once a domain names it, the readiness wait above applies, unbounded (no controller releases a group:
the pod's Event names the nodes not ready). A claim on GPUs without multi-node NVLink is never waited, nor a
claim marked as a gang member's (:func:`gpuplane.api.imex_group.in_gang`).

Then the channel's node is made from ``/proc/devices`` if missing (:mod:`.imex_channel`), and the claim's
record carries the channel, which :mod:`.cdi_assembly` turns into the container's node and environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gpuplane.api import imex, imex_group
from gpuplane.driver.inventory import GpuEntry
from gpuplane.driver.prepare import imex_channel
from gpuplane.driver.sharing.imex_runner import parse_all

log = structlog.get_logger(__name__)


class ImexError(Exception):
    """A claim's IMEX channel cannot be given now; the message says why (kubelet retries the prepare)."""


class ImexWait(ImexError):
    """The claim's domain is not ready on every node yet."""


class ImexRefused(ImexError):
    """The plan names the claim in a way the driver will not follow (two domains)."""


@dataclass(frozen=True)
class Settings:
    """Where this node's channel nodes are made and how."""

    node: str
    dev_dir: Path  # the host directory of the device nodes (the CDI specs' hostPath root)
    proc_devices: Path = Path("/proc/devices")
    placeholder_ok: bool = False  # the simulator without CAP_MKNOD: an empty file stands in for the node
    require_status: bool = False  # wait for ready even when no daemon has reported anything (see above)
    group_wait_s: float = 120.0  # a labelled claim's wait for a domain naming it (see above)


GROUP_WAITS_KEPT = 4096  # labelled claims waiting at once, remembered (the oldest forgotten past it)


def not_ready(domain: imex.ImexDomain, require_status: bool = False) -> tuple[str, ...]:
    """The domain's nodes whose daemon has not reported ready for its current spec (see the module docstring)."""
    if not domain.status and not require_status:
        return ()
    ready = {s.node for s in domain.status if s.ready and s.observedGeneration >= domain.generation}
    return tuple(n for n in domain.nodes if n not in ready)


def wait_message(domain: imex.ImexDomain, waiting: Sequence[str]) -> str:
    """Why a member's prepare waits: the nodes not ready, each with what its driver reported (kubelet puts it on
    the pod's ``FailedPrepareDynamicResources`` Event, so ``kubectl describe pod`` says what is awaited)."""
    said = {s.node: s for s in domain.status}
    parts = []
    for node in waiting:
        entry = said.get(node)
        if entry is None:
            why = "no report from its driver yet"
        elif entry.ready:
            why = f"ready for generation {entry.observedGeneration}, waiting for {domain.generation}"
        else:
            why = (entry.message or "not ready")[:200]
        parts.append(f"{node} ({why})")
    return f"IMEX domain {domain.name} is not ready on node(s) {'; '.join(parts)}; the prepare is retried"


class Gate:
    """What prepare asks for each claim: its channel on this node, its domain ready and its node made."""

    def __init__(
        self,
        list_domains: Callable[[], Sequence[Any]],
        settings: Settings,
        on_unwaited: Callable[[Mapping[str, Any], str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.list_domains = list_domains
        self.settings = settings
        self.on_unwaited = on_unwaited  # (claim, message): a labelled claim prepared without a channel past the bound
        self.clock = clock
        self._refused: set[tuple[str, int]] = set()
        self._group_since: dict[str, float] = {}  # labelled claim uid -> when its wait began

    def channel(
        self, claim_uid: str, gpus: Iterable[GpuEntry], claim: Mapping[str, Any] | None = None
    ) -> imex_channel.Channel | None:
        """The channel of the claim on ``gpus`` (None: no domain names it here, or none can: no GPU of it has
        multi-node NVLink, and then nothing is read); raises :class:`ImexError` to retry later. ``claim``: the
        ResourceClaim (its IMEX group label makes an unnamed claim wait, bounded)."""
        if not any(g.multi_node for g in gpus):
            return None
        try:
            listed = self.list_domains()
        except Exception as exc:
            raise ImexWait(f"cannot read the ImexDomain objects ({exc}); the prepare is retried") from exc
        domains = parse_all(listed, self._refused)
        plan = imex.claims_on(domains, self.settings.node)
        if claim_uid in plan.refused:
            raise ImexRefused(f"no IMEX channel given: {plan.refused[claim_uid]}")
        got = plan.claims.get(claim_uid)
        if got is None:
            self._group_wait(claim_uid, claim or {})
            return None
        self._group_since.pop(claim_uid, None)
        domain = next(d for d in domains if d.name == got.domain)
        waiting = not_ready(domain, self.settings.require_status)
        if waiting:
            raise ImexWait(wait_message(domain, waiting))
        s = self.settings
        try:
            imex_channel.ensure_node(s.dev_dir, s.proc_devices, got.channel, placeholder_ok=s.placeholder_ok)
        except imex_channel.ChannelError as exc:
            raise ImexError(str(exc)) from exc
        return imex_channel.Channel(got.channel, got.domain)

    def _group_wait(self, claim_uid: str, claim: Mapping[str, Any]) -> None:
        """Raise :class:`ImexWait` while a labelled claim waits for a domain naming it; None past the bound."""
        group, _ = imex_group.group_of(claim)
        if not group or imex_group.in_gang(claim):  # a gang member's claim follows its gang: no group wait
            return None
        now = self.clock()
        if claim_uid not in self._group_since and len(self._group_since) >= GROUP_WAITS_KEPT:
            self._group_since.pop(min(self._group_since, key=self._group_since.__getitem__))
        waited = now - self._group_since.setdefault(claim_uid, now)
        bound = self.settings.group_wait_s
        if waited < bound:
            raise ImexWait(
                f"claim is in IMEX group {group!r} and waits for the group's IMEX domain to name it on node "
                f"{self.settings.node} (planned once the group's claims are allocated on two or more nodes of one "
                f"NVLink clique); waited {waited:.0f}s of at most {bound:.0f}s; the prepare is retried"
            )
        del self._group_since[claim_uid]
        message = (
            f"no IMEX domain named this claim of IMEX group {group!r} within {bound:.0f}s; prepared without an IMEX "
            "channel (the group's claims may all be on one node, or the controller refused the group: see its "
            "Events on the claim)"
        )
        log.warning("IMEX group claim prepared without a channel", uid=claim_uid, group=group, why=message)
        if self.on_unwaited is not None:
            self.on_unwaited(claim, message)
        return None


class NoImex:
    """A node without the controller's plan (tests, a driver built without an API): no claim gets a channel."""

    def channel(
        self, claim_uid: str, gpus: Iterable[GpuEntry], claim: Mapping[str, Any] | None = None
    ) -> imex_channel.Channel | None:
        return None
