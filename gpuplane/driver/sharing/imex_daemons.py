"""The IMEX daemon of this node: which one should run, with what files, and what to report. Pure, no I/O.

A node runs one ``nvidia-imex`` (IMEX runs one daemon per OS instance), for the one ``ImexDomain`` that lists
the node (``docs/imex.md``). :func:`wanted` reads the parsed domains and says which daemon should run here,
or why none may, per domain that lists the node:

- two domains listing the node: none (the same rule :func:`gpuplane.api.imex.claims_on` applies to the
  claims; the controller's next pass repairs the plan);
- a domain without an address for some node (``spec.addresses``, the Nodes' InternalIPs as the controller
  read them): none, since the node file must be the same on every node and list every node;
- else the daemon: it binds this node's address and its node file lists the domain's nodes' addresses in
  node-name order.

:func:`next_step` compares what should run with what runs (the files last written, whether the process is
alive) and says what to do: start, stop, restart (a new domain or address: the config is read only at
start), reload (only the node file changed: rewrite it and send ``SIGUSR1``), or keep. A daemon that
exited is started again after :func:`restart_delay`. :func:`merged_status` gives the ``status.nodes`` list
with only this node's entry replaced (what the admission policy lets a driver write).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from gpuplane.api import imex

PEER_PORT = 50000  # IMEX's SERVER_PORT default; the same on every node of a domain
CONFIG = "config.cfg"
NODES = "nodes.cfg"
SOCKET = "cmd.sock"
RECORD = "daemon.json"

Step = Literal["start", "stop", "restart", "reload", "keep"]


@dataclass(frozen=True)
class DaemonWant:
    """The daemon that should run on this node: its domain and generation, its address and its peers'."""

    domain: str
    generation: int
    bind_ip: str
    node_ips: tuple[str, ...]  # every node's address, this one's included, in node-name order


@dataclass(frozen=True)
class Wanted:
    """The daemon to run (None: none) and, per domain listing this node without one, why not."""

    daemon: DaemonWant | None
    refused: Mapping[str, str]  # domain name -> why this node runs no daemon for it


@dataclass(frozen=True)
class Running:
    """What runs now, as the files last written say, and whether its process is alive."""

    domain: str
    bind_ip: str
    node_ips: tuple[str, ...]
    alive: bool


def wanted(domains: Iterable[imex.ImexDomain], node: str) -> Wanted:
    """Which daemon this node should run (see the module docstring)."""
    here = sorted((d for d in domains if node in d.nodes), key=lambda d: d.name)
    if len(here) > 1:
        why = (
            f"node {node} is in more than one IMEX domain ({', '.join(d.name for d in here)}); "
            "a node runs one IMEX daemon, so it runs none until the plan is repaired"
        )
        return Wanted(None, {d.name: why for d in here})
    if not here:
        return Wanted(None, {})
    domain = here[0]
    missing = [n for n in domain.nodes if not domain.address_of(n)]
    if missing:
        why = (
            f"IMEX domain {domain.name} has no address for node(s) {', '.join(missing)} (spec.addresses: the "
            "Node's InternalIP); check `kubectl get node -o wide` and the controller's log"
        )
        return Wanted(None, {domain.name: why})
    ips = tuple(domain.address_of(n) for n in domain.nodes)
    return Wanted(DaemonWant(domain.name, domain.generation, domain.address_of(node), ips), {})


def next_step(want: DaemonWant | None, running: Running | None) -> Step:
    """What to do so that ``running`` becomes ``want`` (a dead daemon is started again: ``start``)."""
    if want is None:
        return "keep" if running is None else "stop"
    if running is None or not running.alive:
        return "start"
    if running.domain != want.domain or running.bind_ip != want.bind_ip:
        return "restart"
    if running.node_ips != want.node_ips:
        return "reload"
    return "keep"


def restart_delay(exits: int, first_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Seconds before starting a daemon again after its ``exits``-th exit in a row (1, 2, 4, ... up to 60)."""
    if exits <= 0:
        return 0.0
    return float(min(cap_s, first_s * 2 ** min(exits - 1, 30)))


def config_text(directory: PurePosixPath, bind_ip: str, port: int = PEER_PORT) -> str:
    """The daemon's config file (read once, at start): its address, the node file, the command socket."""
    lines = [
        "# written by gpuplane-driver (gpuplane/driver/sharing/imex_daemons.py); read by nvidia-imex at start",
        f"SERVER_PORT={port}",
        f"IMEX_NODE_CONFIG_FILE={directory / NODES}",
        f"BIND_INTERFACE_IP={bind_ip}",
        "IMEX_WAIT_FOR_QUORUM=RECOVERY",
        "IMEX_ENABLE_AUTH_ENCRYPTION=0",
        "IMEX_NODE_DISCONNECTED_GRACE_TIME=-1",
        "IMEX_CMD_ENABLED=1",
        f"IMEX_CMD_UNIX_DOMAIN_PATH={directory / SOCKET}",
    ]
    return "\n".join(lines) + "\n"


def node_file_text(node_ips: Sequence[str]) -> str:
    """The node file: one address a line, the same on every node of the domain."""
    return "".join(f"{ip}\n" for ip in node_ips)


def parse_node_file(text: str) -> tuple[str, ...]:
    """The addresses of a node file as written (blank lines and ``#`` comments ignored)."""
    return tuple(s for line in text.splitlines() if (s := line.split("#", 1)[0].strip()))


def is_ready(answer: str) -> bool:
    """``nvidia-imex-ctl -q`` printed exactly ``READY`` (what NVIDIA's probes wait for)."""
    return answer.strip() == "READY"


def status_entry(node: str, ready: bool, message: str, generation: int) -> dict[str, Any]:
    """This node's ``status.nodes[]`` entry (the message cut to the schema's bound)."""
    entry: dict[str, Any] = {"node": node, "ready": ready, "observedGeneration": generation}
    if message:
        entry["message"] = message[: imex.MAX_MESSAGE]
    return entry


def merged_status(current: Any, entry: Mapping[str, Any]) -> list[Any] | None:
    """``status.nodes`` with only ``entry``'s node replaced (appended when absent); None when nothing changes."""
    nodes = list(current) if isinstance(current, list) else []
    out: list[Any] = []
    placed = False
    for item in nodes:
        if isinstance(item, Mapping) and item.get("node") == entry["node"]:
            if not placed:
                out.append(dict(entry))
                placed = True
            continue  # a second entry of this node (refused by the schema) is dropped
        out.append(item)
    if not placed:
        out.append(dict(entry))
    return None if out == nodes else out
