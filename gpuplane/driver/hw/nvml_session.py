"""The NVML session every part of the NVML backend works through: one lock, translated errors.

Rules (NVML API reference, docs.nvidia.com/deploy/nvml-api, and nvidia-ml-py behaviour): every
call is serialized by one lock (concurrent NVML calls on a handle can be very slow), and
``pynvml.NVMLError`` becomes :class:`~gpuplane.driver.hw.interface.HardwareError` with the
matching :class:`~gpuplane.driver.hw.interface.ErrorCode`. Also the text helpers NVML's answers
need (bytes or str, PCI bus ids, CUDA versions). No I/O of its own: the calls go to the module
given (``pynvml``, or a fake in tests).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from gpuplane.driver.hw.interface import ErrorCode, HardwareError

# NVML_ERROR_* names -> our codes (looked up by name so a fake module only needs the constants it uses).
_ERROR_NAMES: dict[str, ErrorCode] = {
    "NVML_ERROR_UNINITIALIZED": ErrorCode.UNINITIALIZED,
    "NVML_ERROR_INVALID_ARGUMENT": ErrorCode.INVALID_ARGUMENT,
    "NVML_ERROR_NOT_SUPPORTED": ErrorCode.NOT_SUPPORTED,
    "NVML_ERROR_NO_PERMISSION": ErrorCode.NO_PERMISSION,
    "NVML_ERROR_NOT_FOUND": ErrorCode.NOT_FOUND,
    "NVML_ERROR_GPU_NOT_FOUND": ErrorCode.NOT_FOUND,
    "NVML_ERROR_GPU_IS_LOST": ErrorCode.GPU_IS_LOST,
    "NVML_ERROR_RESET_REQUIRED": ErrorCode.RESET_REQUIRED,
    "NVML_ERROR_IN_USE": ErrorCode.IN_USE,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": ErrorCode.INSUFFICIENT_RESOURCES,
}


class NvmlSession:
    """The loaded NVML module, its lock and its error codes (the base of ``NvmlBackend``'s parts)."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml: Any = nvml
        self._lock = threading.RLock()
        self._code_by_value: dict[int, ErrorCode] = {
            getattr(self._nvml, n): c for n, c in _ERROR_NAMES.items() if hasattr(self._nvml, n)
        }

    def translate(self, err: BaseException) -> HardwareError:
        """An NVMLError as a HardwareError with the matching code (UNKNOWN for codes we don't distinguish)."""
        value = getattr(err, "value", None)
        code = self._code_by_value.get(value, ErrorCode.UNKNOWN) if isinstance(value, int) else ErrorCode.UNKNOWN
        return HardwareError(code, str(err) or f"NVML error {value}")

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Serialize and translate: the frame every public call runs in."""
        with self._lock:
            try:
                yield
            except self._nvml.NVMLError as e:
                raise self.translate(e) from e

    def _try(self, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """Call an optional NVML query; unsupported/absent -> ``default``; a lost GPU still raises."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            if self.translate(e).code is ErrorCode.GPU_IS_LOST:
                raise
            return default

    def _handle(self, uuid: str) -> Any:
        return self._nvml.nvmlDeviceGetHandleByUUID(uuid)

    def _const(self, name: str, default: int) -> int:
        return int(getattr(self._nvml, name, default))


def normalize_pci_bus_id(bus_id: str | bytes) -> str:
    """``00000000:18:00.0`` (NVML, 8-digit domain) -> ``0000:18:00.0`` (sysfs form, lower case)."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        domain = int(parts[0], 16)
        return f"{domain:04x}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:  # no domain given
        return f"0000:{parts[0]}:{parts[1]}"
    raise ValueError(f"not a PCI bus id: {bus_id!r}")


def cuda_version_text(version: int) -> str:
    """NVML's integer CUDA driver version (12080) -> "12.8"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
