"""``NvmlBackend``: the ``GpuBackend`` protocol over the NVML session and its parts.

Each call goes to the part that owns it: :mod:`slicer.nvml.discovery` (what the GPUs are),
:mod:`slicer.nvml.instances` (MIG mode and instances), :mod:`slicer.nvml.events` (health); the
session (:mod:`slicer.nvml.session`) is shared by all, so ``nvmlInit`` runs once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_slicer.core.devices import MigInstance
from gpu_slicer.slicer.backend import GpuInfo, HealthEvent
from gpu_slicer.slicer.errors import BackendError
from gpu_slicer.slicer.nvml.discovery import Discovery
from gpu_slicer.slicer.nvml.events import HealthWatch
from gpu_slicer.slicer.nvml.instances import Instances
from gpu_slicer.slicer.nvml.session import NvmlSession


class NvmlBackend:
    """``GpuBackend`` over NVML. ``nvml`` is the ``pynvml`` module (or a fake of it)."""

    def __init__(self, nvml: Any = None, *, root: str | Path = "/") -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._session = NvmlSession(nvml, Path(root))
        self._discovery = Discovery(self._session)
        self._instances = Instances(self._session, self._discovery)
        self._health = HealthWatch(self._session)

    def boot_id(self) -> str:
        path = self._session.root / "proc/sys/kernel/random/boot_id"
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise BackendError(f"cannot read the boot id from {path}: {exc}") from exc

    def gpus(self) -> list[GpuInfo]:
        """Every GPU with its current MIG mode (a lost GPU keeps its last known facts)."""
        return self._discovery.gpus()

    def instances(self, gpu_index: int) -> list[MigInstance]:
        return self._instances.instances(gpu_index)

    def create_gpu_instance(self, gpu_index: int, profile: str, start: int) -> int:
        return self._instances.create_gpu_instance(gpu_index, profile, start)

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> MigInstance:
        return self._instances.create_compute_instance(gpu_index, gi_id)

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        self._instances.destroy_compute_instance(gpu_index, gi_id, ci_id)

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        self._instances.destroy_gpu_instance(gpu_index, gi_id)

    def processes(self, gpu_index: int, gi_id: int | None = None) -> list[int]:
        return self._instances.processes(gpu_index, gi_id)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        self._instances.set_mig_mode(gpu_index, enabled)

    def capability_minors(self, gpu_index: int, gi_id: int, ci_id: int) -> tuple[int, int]:
        return self._instances.capability_minors(gpu_index, gi_id, ci_id)

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        """Xid critical errors and lost GPUs, best effort: a GPU without events is skipped.

        The first call creates the event set; if NVML cannot create one at all, that error is
        raised (every call) so the caller can fall back to polling.
        """
        return self._health.events(timeout_s)

    def close(self) -> None:
        """Free the event set and shut NVML down (the agent calls it on exit)."""
        session = self._session
        with session.lock:
            if not session.started:
                return
            self._health.free()
            session.shutdown()
