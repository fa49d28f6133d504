"""The mock NVML library (sandbox/go/nvmlmock) loaded into the test process, and its controls.

The library is loaded by its path before ``pynvml`` loads ``libnvidia-ml.so.1`` by name: the
dynamic loader hands back an already loaded library whose SONAME matches, so the unmodified
bindings call the mock. :class:`MockNvml` wraps the ``gpuSlicerMock*`` test controls.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pynvml

# NVML return codes the tests inject (nvml.h).
SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
GPU_IS_LOST = 15
RESET_REQUIRED = 16
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999


class MockError(RuntimeError):
    """A control call of the mock library failed."""


class MockNvml:
    """Controls of the loaded mock library: the node's GPUs, faults, events, the driver files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        self.lib.gpuSlicerMockXid.argtypes = [ctypes.c_uint, ctypes.c_ulonglong]

    def check_bindings(self) -> None:
        """pynvml must call this library, not a real driver's."""
        pynvml._LoadNvmlLibrary()
        if not hasattr(pynvml.nvmlLib, "gpuSlicerMockReset"):
            raise MockError(f"pynvml loaded {pynvml.nvmlLib} instead of the mock at {self.path}")

    def _ok(self, code: int, what: str) -> None:
        if code != 0:
            buf = ctypes.create_string_buffer(1024)
            self.lib.gpuSlicerMockLastError(buf, len(buf))
            raise MockError(f"{what}: NVML code {code} {buf.value.decode()}")

    def reset(self, spec: str, *, root: Path | None = None) -> None:
        """A node with the GPUs of ``spec`` (``h100:2,l4``); driver files under ``root``."""
        self._ok(self.lib.gpuSlicerMockReset(spec.encode()), f"reset {spec!r}")
        self._ok(self.lib.gpuSlicerMockSetRoot(str(root or "").encode()), "set root")

    def fail(self, function: str, code: int, times: int = 1) -> None:
        """The next ``times`` calls of ``function`` (as exported: ``nvmlDeviceGetCount_v2``)
        return ``code``."""
        self._ok(self.lib.gpuSlicerMockFail(function.encode(), code, times), f"fail {function}")

    def set_mig_mode(self, index: int, current: bool, pending: bool | None = None) -> None:
        pending = current if pending is None else pending
        self._ok(self.lib.gpuSlicerMockSetMigMode(index, int(current), int(pending)), "mig mode")

    def needs_reset(self, index: int, needs: bool = True) -> None:
        self._ok(self.lib.gpuSlicerMockNeedsReset(index, int(needs)), "needs reset")

    def profiles_need_mig(self, index: int, needs: bool = True) -> None:
        """The GPU reports its MIG profiles only while MIG is on (some drivers)."""
        self._ok(self.lib.gpuSlicerMockProfilesNeedMig(index, int(needs)), "profiles need MIG")

    def reset_gpu(self, index: int) -> None:
        self._ok(self.lib.gpuSlicerMockResetGpu(index), "reset GPU")

    def move_ci_profile(self, index: int, from_constant: int, to_constant: int) -> None:
        self._ok(
            self.lib.gpuSlicerMockMoveCiProfile(index, from_constant, to_constant), "move profile"
        )

    def set_process(self, index: int, gi_id: int, pid: int) -> None:
        self._ok(self.lib.gpuSlicerMockSetProcess(index, gi_id, pid), "set process")

    def xid(self, index: int, xid: int) -> None:
        self._ok(self.lib.gpuSlicerMockXid(index, xid), "xid")

    def set_fabric(self, index: int, cluster: bytes, clique: int, *, complete: bool = True) -> None:
        """The GPU belongs to fabric ``cluster`` (16 bytes), clique ``clique``."""
        raw = (ctypes.c_ubyte * 16)(*cluster)
        state = 3 if complete else 1  # NVML_GPU_FABRIC_STATE_COMPLETED / _NOT_STARTED
        self._ok(self.lib.gpuSlicerMockSetFabric(index, raw, clique, state), "set fabric")

    def lose_gpu(self, index: int, lost: bool = True) -> None:
        self._ok(self.lib.gpuSlicerMockLoseGpu(index, int(lost)), "lose GPU")

    def describe(self) -> dict[str, Any]:
        """The mock's own view of the node (not NVML's answers)."""
        buf = ctypes.create_string_buffer(1 << 20)
        self._ok(self.lib.gpuSlicerMockDescribe(buf, len(buf)), "describe")
        data: dict[str, Any] = json.loads(buf.value.decode())
        return data

    def instances(self, index: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.describe()["gpus"][index]["gpu_instances"]
        return found
