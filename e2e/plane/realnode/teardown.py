"""Take a real node off the machine: every process, mount, cgroup, bridge, rule and directory it made.

Order matters: the driver and kubelet first (nothing starts new containers),
then whatever still runs in the node's cgroup (the containers), then the
containerd shims (they run in their own sessions, so stopping containerd's
process group does not reach them; they are found by the socket address on
their command line), then containerd and the MPS daemons the driver started;
then the mounts under the node's runtime directories (pod volumes, container
root filesystems, ``/dev/shm``, network-namespace files), the cgroup subtree,
iptables rules naming the node's bridge or subnet, the bridge itself, libcni's
cached results and the runtime directories. ``teardown`` returns what it could
not remove, so callers can fail loudly instead of leaving a machine dirty.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from e2e.cluster import procs
from e2e.cluster.realnode import cgroups, mounts, network
from e2e.plane.realnode.plan import RealNode
from gpuplane.driver.sharing.mps import MpsControl

Printer = Callable[[str], None]

REPO_ROOT = Path(__file__).resolve().parents[3]
MPS_STANDIN = REPO_ROOT / "tests" / "fakes" / "nvidia-cuda-mps-control"


def live_processes(environ: bool = False) -> Iterator[tuple[int, str, str]]:
    """(pid, command line, environment) of every readable process but this one that is not a zombie.

    Arguments and variables are joined by spaces; the environment is read only when ``environ``
    (else ""), so a process whose environment is not readable still counts without it.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (entry / "environ").read_bytes().replace(b"\0", b" ").decode(errors="replace") if environ else ""
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            yield int(entry.name), cmdline, env


def processes_mentioning(needle: str) -> list[int]:
    """Pids (not zombies) whose command line contains ``needle``."""
    return [pid for pid, cmdline, _ in live_processes() if needle in cmdline]


def kill_shims(node: RealNode, timeout: float = 5.0) -> int:
    """SIGKILL the containerd shims serving this node's containerd; return how many there were."""
    needle = f"-address {node.containerd_socket} "
    shims = [p for p in processes_mentioning(needle) if "containerd-shim" in _comm(p)]
    for pid in shims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and _comm(p) for p in shims):
        time.sleep(0.1)
    return len(shims)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def stop_processes(node: RealNode, pid_dir: Path, out: Printer) -> list[str]:
    """Stop the node's driver, kubelet and containerd recorded in ``pid_dir`` (shims and containers too)."""
    records = procs.read_records(pid_dir)
    stopped = []
    driver, kubelet, containerd = node.processes
    for name in (driver, kubelet):
        record = records.get(name)
        if record is not None:
            if procs.is_alive(record):
                out(f"stopping {name} (pid {record.pid})")
                procs.stop(record)
                stopped.append(name)
            procs.pidfile(pid_dir, name).unlink(missing_ok=True)
    killed = cgroups.kill_all(node.cgroup_root)
    shims = kill_shims(node)
    if killed or shims:
        out(f"{node.name}: killed {killed} container process(es) and {shims} shim(s)")
    record = records.get(containerd)
    if record is not None:
        if procs.is_alive(record):
            out(f"stopping {containerd} (pid {record.pid})")
            procs.stop(record)
            stopped.append(containerd)
        procs.pidfile(pid_dir, containerd).unlink(missing_ok=True)
    if node.mps_root.is_dir():
        gone = MpsControl(node.mps_root, str(MPS_STANDIN)).cleanup_orphans(keep=set())
        if gone:
            out(f"{node.name}: stopped {len(gone)} MPS daemon(s)")
    return stopped


def remove_host_state(node: RealNode, out: Printer) -> list[str]:
    """Unmount, remove cgroups, iptables rules, bridge, CNI cache and runtime dirs; return what is left."""
    left = mounts.unmount_under(node.base_dir) + mounts.unmount_under(node.node_dir)
    left += [f"cgroup {p} still exists" for p in cgroups.remove(node.cgroup_root)]
    rules = network.remove_iptables_rules([node.bridge, node.network], [node.ip_network])
    if rules:
        out(f"{node.name}: removed {len(rules)} iptables rule(s)")
    try:
        network.delete_bridge(node.bridge)
    except network.NetworkError as err:
        left.append(str(err))
    sandboxes = node.containerd_state / "io.containerd.grpc.v1.cri" / "sandboxes"
    network.remove_cni_cache(node.network, [p.name for p in sandboxes.iterdir()] if sandboxes.is_dir() else [])
    if not left:
        shutil.rmtree(node.base_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            node.base_dir.parent.rmdir()  # the /tmp/gprn-<hash> parent, once its last node is gone
    return left


def teardown(node: RealNode, pid_dir: Path, out: Printer = print) -> list[str]:
    """Stop the node's processes and remove everything it made on the machine; return what is left."""
    stop_processes(node, pid_dir, out)
    left = remove_host_state(node, out)
    for problem in left:
        out(f"{node.name}: could not clean up: {problem}")
    return left


def leftovers(node: RealNode) -> list[str]:
    """What of the node is still on the machine (empty after a clean teardown)."""
    found = [f"process {pid}: {_comm(pid)}" for pid in processes_mentioning(str(node.base_dir) + "/")]
    found += [f"process {pid}: {_comm(pid)}" for pid in processes_mentioning(str(node.node_dir) + "/")]
    found += [f"mount {point}" for point in mounts.mounts_under(node.base_dir)]
    found += [f"cgroup {path}" for path in cgroups.paths(node.cgroup_root) if path.exists()]
    if network.bridge_exists(node.bridge):
        found.append(f"bridge {node.bridge}")
    for table in network.IPTABLES_TABLES:
        listed = subprocess.run(["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True, check=False)
        found += [
            f"iptables {table}: {line}"
            for line in listed.stdout.splitlines()
            if network.rule_mentions(line, [node.bridge, node.network], [node.ip_network])
        ]
    if network.CNI_CACHE.is_dir():
        found += [f"CNI cache {p}" for p in network.CNI_CACHE.glob(f"{node.network}-*")]
    if node.base_dir.exists():
        found.append(f"directory {node.base_dir}")
    return found
