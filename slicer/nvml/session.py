"""The NVML session: initialised once, device handles looked up once, NVML's errors as ours.

Every other module of the backend calls NVML through :meth:`NvmlSession.call`, so an
``NVMLError`` always becomes a :class:`slicer.errors.BackendError` subclass (raised ``from``
the ``NVMLError``) whose message says what the agent was doing and what to do about it.
"""

from __future__ import annotations

import threading
from ctypes import byref, c_uint, c_void_p, cast
from pathlib import Path
from typing import Any

from gpu_slicer.slicer import errors
from gpu_slicer.slicer.errors import BackendError, GpuNotFound, NotSupported

_ERRORS: dict[str, tuple[type[BackendError], str]] = {
    "NVML_ERROR_IN_USE": (
        errors.GpuInUse,
        "processes or compute instances still use it; retry later",
    ),
    "NVML_ERROR_INSUFFICIENT_RESOURCES": (
        errors.InsufficientResources,
        "the placement overlaps an instance or a budget is exhausted",
    ),
    "NVML_ERROR_NOT_FOUND": (GpuNotFound, "it does not exist (any more)"),
    "NVML_ERROR_NOT_SUPPORTED": (NotSupported, "this GPU or driver cannot do it"),
    "NVML_ERROR_NO_PERMISSION": (
        errors.NoPermission,
        "the agent needs root or CAP_SYS_ADMIN and access to /dev/nvidia-caps",
    ),
    "NVML_ERROR_RESET_REQUIRED": (errors.ResetRequired, "the GPU must be reset first"),
    "NVML_ERROR_GPU_IS_LOST": (errors.GpuLost, "the GPU needs a reset or a reboot"),
}
"""NVML's errors -> ours, with what to do about each."""

ABSENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_FOUND")
"""NVML's answers for a profile a device does not offer."""


class NvmlSession:
    """The ``pynvml`` module (or a fake of it), its one ``nvmlInit`` and the GPUs' handles.

    ``root`` is where ``/proc`` and ``/sys`` are read from, injectable so tests can lay them out.
    """

    def __init__(self, nvml: Any, root: Path) -> None:
        self.nvml = nvml
        self.root = root
        self.lock = threading.RLock()
        self.started = False
        self.handles: list[Any] = []

    def start(self) -> None:
        """``nvmlInit`` and the device handles, once (an uncached look-up can take seconds)."""
        with self.lock:
            if self.started:
                return
            self.call(None, "nvmlInit", doing="initialise NVML (is the driver loaded?)")
            count = int(self.call(None, "nvmlDeviceGetCount"))
            self.handles = [self.call(i, "nvmlDeviceGetHandleByIndex", i) for i in range(count)]
            self.started = True

    def shutdown(self) -> None:
        self.nvml.nvmlShutdown()
        self.started = False

    def handle(self, gpu_index: int) -> Any:
        self.start()
        if not 0 <= gpu_index < len(self.handles):
            raise GpuNotFound(f"no GPU {gpu_index}: NVML sees {len(self.handles)}", gpu=gpu_index)
        return self.handles[gpu_index]

    def mig_mode(self, gpu_index: int) -> tuple[bool, bool]:
        """(current, pending); a GPU without MIG (NVML: NOT_SUPPORTED) is off and stays so."""
        try:
            current, pending = self.call(gpu_index, "nvmlDeviceGetMigMode", self.handles[gpu_index])
        except NotSupported:
            return False, False
        return bool(current), bool(pending)

    def call(self, gpu: int | None, name: str, *args: Any, doing: str = "") -> Any:
        """``pynvml.<name>(*args)``, its ``NVMLError`` raised as a ``BackendError``."""
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as exc:
            raise self.error(gpu, doing or name, exc) from exc

    def error(self, gpu: int | None, doing: str, exc: Any) -> BackendError:
        code = getattr(exc, "value", None)
        where = f" on GPU {gpu}" if gpu is not None else ""
        for constant, (kind, hint) in _ERRORS.items():
            if code == getattr(self.nvml, constant, object()):
                return kind(f"{doing}{where}: {exc}; {hint}", gpu=gpu)
        return BackendError(f"{doing}{where}: {exc} (NVML error {code})", gpu=gpu)

    def is_error(self, exc: BackendError, *constants: str) -> bool:
        """Whether the NVML error behind ``exc`` is one of ``constants`` (by name)."""
        code = getattr(exc.__cause__, "value", None)
        return any(code == getattr(self.nvml, c, object()) for c in constants)

    def list(
        self, gpu: int, name: str, parent: Any, profile_id: int, item_type: Any, capacity: int
    ) -> list[Any]:
        """Call an NVML list function that fills a caller-sized array and a count."""
        array = (item_type * max(1, int(capacity)))()
        count = c_uint(len(array))
        self.call(gpu, name, parent, profile_id, array, byref(count))
        return [array[k] for k in range(count.value)]

    def constants(self, prefix: str) -> dict[int, str]:
        """The bindings' ``<prefix>*`` constants by value, ``<prefix>COUNT`` left out."""
        return {
            int(getattr(self.nvml, n)): n
            for n in dir(self.nvml)
            if n.startswith(prefix) and n != f"{prefix}COUNT"
        }


def text(value: Any) -> str:
    """NVML's strings arrive as bytes from the C library, as str from some bindings."""
    return value.decode() if isinstance(value, bytes) else str(value)


def canonical_bus_id(nvml_bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML) -> ``0000:3b:00.0`` (sysfs and Kubernetes)."""
    domain, bus, device_function = nvml_bus_id.strip().split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{device_function.lower()}"


def address(handle: Any) -> int | None:
    """A device handle's pointer value, to find which of ours NVML handed back."""
    try:
        return cast(handle, c_void_p).value
    except Exception:  # not a ctypes pointer (a fake's handle): compare by identity
        return id(handle)
