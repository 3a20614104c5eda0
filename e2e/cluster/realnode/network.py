"""A real node's pod network: its own bridge, /24 subnet, CNI config and IPAM store; and their removal.

Each real node gets a Linux bridge (``gp<cluster tag>r<index>``, at most 15
characters) that the harness makes before kubelet starts, with the subnet's
first address on it. That address is also the node's InternalIP: kubelet
refuses a loopback ``--node-ip``, and an address on a bridge the harness owns
keeps all test traffic on this machine (kube-apiserver dials kubelet there). The
CNI ``bridge`` plugin attaches pods to that bridge (``isGateway``, no masquerade:
pods need no traffic beyond the machine), ``host-local`` hands out addresses
from the subnet with its data in the node's own directory, ``portmap`` serves
``hostPort`` (and adds iptables rules only for pods that ask for one).

Subnets are chosen under a machine-wide lock from 10.200.0.0/16 - 10.249.0.0/16,
starting at a place derived from the cluster tag and skipping every network an
interface or route already uses, so two clusters on one machine never share one.
``remove_iptables_rules`` deletes any rule that names the node's bridge, network
or subnet (kubelet is told not to make its own chains: ``makeIPTablesUtilChains:
false``).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

LOCK_FILE = Path("/run/lock/gpuplane-realnodes.lock")
SECOND_OCTETS = range(200, 250)
CNI_CACHE = Path("/var/lib/cni/results")
IPTABLES_TABLES = ("filter", "nat", "mangle")
_EXTRA_PATH = ":/usr/sbin:/sbin"


class NetworkError(RuntimeError):
    """A bridge or subnet could not be set up."""


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=_EXTRA_PATH)
    if found is None:
        raise NetworkError(f"`{name}` not found (apt-get install {'iproute2' if name == 'ip' else name})")
    return found


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True, check=False, timeout=60)
    if check and done.returncode != 0:
        raise NetworkError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done


@contextlib.contextmanager
def allocation_lock() -> Iterator[None]:
    """Held while a cluster picks subnets and makes its bridges, so two clusters never pick the same."""
    path = LOCK_FILE if LOCK_FILE.parent.is_dir() else Path("/tmp") / LOCK_FILE.name
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def networks_in_use() -> set[ipaddress.IPv4Network]:
    """Every IPv4 network on an interface or in a route of this machine."""
    used: set[ipaddress.IPv4Network] = set()
    addresses = json.loads(_run("ip", "-j", "-4", "addr", "show").stdout or "[]")
    for link in addresses:
        for info in link.get("addr_info") or []:
            used.add(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    routes = json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.add(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return used


def pick_subnet(
    seed: int, used: Iterable[ipaddress.IPv4Network], taken: Iterable[ipaddress.IPv4Network] = ()
) -> ipaddress.IPv4Network:
    """The first free /24 in 10.200-249.x.0, walking from a place given by ``seed``."""
    busy = [*used, *taken]
    count = len(SECOND_OCTETS) * 256
    for step in range(count):
        slot = (seed + step) % count
        candidate = ipaddress.IPv4Network(f"10.{SECOND_OCTETS[slot // 256]}.{slot % 256}.0/24")
        if not any(candidate.overlaps(other) for other in busy):
            return candidate
    raise NetworkError("no free /24 left in 10.200.0.0-10.249.255.0 for a real node's pods")


def gateway(subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    """The subnet's first address: the bridge's, and the node's InternalIP."""
    return subnet.network_address + 1


def bridge_exists(name: str) -> bool:
    """Whether a link called ``name`` exists."""
    return _run("ip", "link", "show", "dev", name, check=False).returncode == 0


def make_bridge(name: str, subnet: ipaddress.IPv4Network) -> None:
    """Create bridge ``name`` with the subnet's gateway address, up (idempotent)."""
    if not bridge_exists(name):
        _run("ip", "link", "add", "name", name, "type", "bridge")
    address = str(gateway(subnet))
    shown = _run("ip", "-j", "-4", "addr", "show", "dev", name).stdout
    if f'"{address}"' not in shown:
        _run("ip", "addr", "add", f"{address}/{subnet.prefixlen}", "dev", name)
    _run("ip", "link", "set", "dev", name, "up")


def delete_bridge(name: str) -> bool:
    """Delete bridge ``name`` if it exists; return whether it did."""
    if not bridge_exists(name):
        return False
    _run("ip", "link", "del", "dev", name)
    return True


def conflist(network: str, bridge: str, subnet: ipaddress.IPv4Network, ipam_dir: Path) -> dict[str, Any]:
    """The node's CNI network configuration list."""
    return {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(subnet), "gateway": str(gateway(subnet))}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def write_conflist(conf_dir: Path, config: dict[str, Any]) -> Path:
    """Write ``10-<network>.conflist`` into the node's CNI config directory."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    path = conf_dir / f"10-{config['name']}.conflist"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def _subnet_pattern(subnet: ipaddress.IPv4Network) -> re.Pattern[str]:
    prefix = ".".join(str(subnet.network_address).split(".")[:3])
    return re.compile(rf"(?<![\d.]){re.escape(prefix)}\.\d+")


def rule_mentions(line: str, markers: Sequence[str], subnets: Sequence[ipaddress.IPv4Network]) -> bool:
    """Whether an ``iptables -S`` line names one of the node's bridges, networks or subnets."""
    words = set(re.split(r"[\s\"'\\]+", line))
    return any(m in words or f'"{m}"' in line for m in markers) or any(_subnet_pattern(s).search(line) for s in subnets)


def remove_iptables_rules(markers: Sequence[str], subnets: Sequence[ipaddress.IPv4Network]) -> list[str]:
    """Delete every iptables rule naming a marker or subnet, then the CNI chains that leaves empty; return them."""
    if shutil.which("iptables", path=_EXTRA_PATH) is None and shutil.which("iptables") is None:
        return []
    removed: list[str] = []
    for table in IPTABLES_TABLES:
        listed = _run("iptables", "-w", "-t", table, "-S", check=False)
        if listed.returncode != 0:
            continue
        lines = listed.stdout.splitlines()
        for line in lines:
            if line.startswith("-A ") and rule_mentions(line, markers, subnets):
                _run("iptables", "-w", "-t", table, "-D", *shlex.split(line)[1:], check=False)
                removed.append(f"{table}: {line}")
        remaining = _run("iptables", "-w", "-t", table, "-S", check=False).stdout.splitlines()
        chains = [ln.split()[1] for ln in remaining if ln.startswith("-N CNI-DN-") or ln.startswith("-N CNI-SN-")]
        for chain in chains:
            rules = [ln for ln in remaining if ln.startswith(f"-A {chain} ")]
            referenced = any(f"-j {chain}" in ln for ln in remaining)
            if not rules and not referenced:
                _run("iptables", "-w", "-t", table, "-X", chain, check=False)
                removed.append(f"{table}: -X {chain}")
    return removed


def remove_cni_cache(network: str, sandbox_ids: Iterable[str] = (), cache: Path = CNI_CACHE) -> int:
    """Delete libcni's cached results of the node's pods; return how many files.

    libcni keeps ``/var/lib/cni/results/<network>-<sandbox>-<if>`` for each attachment, and containerd's
    own loopback network ``cni-loopback-<sandbox>-lo``; the node's sandboxes are those of its network's
    entries and ``sandbox_ids`` (from containerd's state).
    """
    if not cache.is_dir():
        return 0
    ids = set(sandbox_ids)
    ours = list(cache.glob(f"{network}-*"))
    ids.update(p.name[len(network) + 1 :].rsplit("-", 1)[0] for p in ours)
    ours += [cache / f"cni-loopback-{sandbox}-lo" for sandbox in ids]
    removed = 0
    for path in ours:
        if path.exists():
            path.unlink(missing_ok=True)
            removed += 1
    return removed
