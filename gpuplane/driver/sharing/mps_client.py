"""The MPS control client: ``nvidia-cuda-mps-control`` in client mode, and the read-back of every setting.

With neither ``-d`` nor ``-f`` the binary is a client: it reads commands on stdin and prints the
daemon's replies, exiting non-zero ("Cannot find MPS control daemon process") when no daemon
answers. Its exit status says only whether a daemon was reached, so :meth:`MpsClient.configure`
reads each setting back: ``set_default_active_thread_percentage`` echoes the value (``25.0``);
``set_default_device_pinned_mem_limit <dev> <N>M`` takes the device ordinal within
CUDA_VISIBLE_DEVICES and prints nothing, and real daemons show a limit of at least 1 GiB in whole
GiB. ``set_default_client_priority`` (0 normal, 1 below normal) is read back with
``get_default_client_priority``. The defaults apply to servers started afterwards and are lost on ``quit``.

Side effects: runs the client binary (a subprocess per command) in a clean environment naming
the claim's pipe and log dirs; :meth:`MpsClient.configure` changes the daemon's defaults.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from gpuplane.driver.sharing.mps_spec import MIB, DaemonPaths, MpsError, MpsSpec

_MEM_REPLY = re.compile(r"^(\d+)([MG])$")


class MpsClient:
    """Client-mode commands to the control daemon of one claim's pipe dir."""

    def __init__(self, binary: str, paths: DaemonPaths, timeout_s: float) -> None:
        self.binary = binary
        self.paths = paths
        self.timeout_s = timeout_s

    def env(self) -> dict[str, str]:
        """A clean environment: nothing of the driver's own CUDA_* settings leaks in."""
        return {
            "PATH": os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            "CUDA_MPS_PIPE_DIRECTORY": str(self.paths.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(self.paths.log),
        }

    def run(self, command: str) -> subprocess.CompletedProcess[str] | None:
        """Run the binary in client mode with ``command`` on stdin; None on timeout."""
        try:
            return subprocess.run(
                [self.binary],
                input=command + "\n",
                env=self.env(),
                cwd=self.paths.root if self.paths.root.is_dir() else "/",
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None
        except OSError as err:
            raise MpsError(f"cannot run {self.binary}: {err}") from err

    def ask(self, command: str) -> str:
        """Send one command; return the reply. A daemon that cannot be reached is an error."""
        result = self.run(command)
        if result is None or result.returncode != 0:
            detail = (
                "no answer"
                if result is None
                else f"status {result.returncode}: " + one_line(result.stdout + result.stderr)
            )
            raise MpsError(f"claim {self.paths.claim_uid}: {command!r} failed ({detail}){log_tail(self.paths.log)}")
        return result.stdout.strip()

    def answers(self) -> tuple[bool, str]:
        """Whether a daemon answers a query now, and what the last attempt said when not."""
        result = self.run("get_default_active_thread_percentage")
        if result is None:
            return False, ""
        if result.returncode == 0 and parse_float(result.stdout) is not None:
            return True, ""
        return False, f"a query got status {result.returncode}: {one_line(result.stdout + result.stderr)}"

    def configure(self, spec: MpsSpec) -> None:
        """Send the spec's defaults and read each one back; MpsError when one did not take."""
        claim = spec.claim_uid
        tail = self.paths.log
        pct = spec.active_thread_percentage
        if pct is not None:
            reply = self.ask(f"set_default_active_thread_percentage {pct}")
            if parse_float(reply) != float(pct):
                raise MpsError(
                    f"claim {claim}: set_default_active_thread_percentage {pct} was refused: "
                    f"{one_line(reply)!r}{log_tail(tail)}"
                )
            reply = self.ask("get_default_active_thread_percentage")
            if parse_float(reply) != float(pct):
                raise MpsError(
                    f"claim {claim}: active thread percentage reads back as {one_line(reply)!r}, "
                    f"not {pct}{log_tail(tail)}"
                )
        if spec.client_priority is not None:
            answer = self.ask(f"set_default_client_priority {spec.client_priority}")
            reply = self.ask("get_default_client_priority")
            if parse_priority(reply) != spec.client_priority:
                raise MpsError(
                    f"claim {claim}: set_default_client_priority {spec.client_priority} did not take: it answered "
                    f"{one_line(answer)!r} and the priority reads back as {one_line(reply)!r} (a driver without "
                    f"MPS client priorities? use a tier without clientPriority){log_tail(tail)}"
                )
        for index, uuid in enumerate(spec.device_uuids):
            limit = spec.pinned_memory_limits.get(uuid)
            if limit is None:
                continue
            mib = limit // MIB
            command = f"set_default_device_pinned_mem_limit {index} {mib}M"
            answer = self.ask(command)  # prints nothing when accepted
            reply = self.ask(f"get_default_device_pinned_mem_limit {index}")
            if not mem_reply_matches(reply, mib):
                raise MpsError(
                    f"claim {claim}: {command} ({uuid}) did not take: it answered {one_line(answer)!r} "
                    f"and the limit reads back as {one_line(reply)!r}{log_tail(tail)}"
                )


def log_tail(log_dir: Path, lines: int = 15) -> str:
    """The last lines of the daemon's launcher and control logs, for an error message."""
    parts = []
    for name in ("launcher.log", "control.log"):
        try:
            text = (log_dir / name).read_text(errors="replace").splitlines()
        except OSError:
            continue
        if text:
            parts.append(f"\n--- {name} (last {min(lines, len(text))} lines) ---\n" + "\n".join(text[-lines:]))
    return "".join(parts) if parts else "\n(no MPS log output)"


def parse_float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def parse_priority(reply: str) -> int | None:
    """A client-priority reply: ``1``, ``1 [BELOW NORMAL]``, ``BELOW_NORMAL`` -> 1; None when unreadable."""
    text = reply.strip().upper().replace(" ", "_")
    m = re.match(r"^(\d+)", text)
    if m:
        return int(m.group(1))
    return {"NORMAL": 0, "BELOW_NORMAL": 1}.get(text.strip("[]"))


def mem_reply_matches(reply: str, mib: int) -> bool:
    """Real daemons show a limit of at least 1 GiB in whole GiB (1044M reads ``1G``)."""
    m = _MEM_REPLY.match(reply.strip())
    if not m:
        return False
    value, unit = int(m.group(1)), m.group(2)
    return value == mib if unit == "M" else mib >= 1024 and value == mib // 1024


def one_line(text: str, limit: int = 300) -> str:
    flat = " | ".join(line for line in text.strip().splitlines() if line)
    return flat if len(flat) <= limit else flat[:limit] + "..."
