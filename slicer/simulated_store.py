"""Simulated GPUs whose MIG state outlives the agent process, as real GPUs' does.

On a real node the MIG instances stay on the GPU when the agent restarts; a fresh in-memory
:class:`~slicer.simulated.SimulatedBackend` would forget them. :class:`PersistedBackend` keeps the
simulated GPUs' modes and instances in a JSON file (``agent run --simulate-state FILE``), loads it
at start and rewrites it atomically after every call that changes them. The sandbox uses it to
restart agents under running pods, and tests read the file to see what exists on the "GPU".

Health faults come in from outside the agent process the same way: :func:`queue_event` (``gpu-slicer
agent simulate-event``) drops one file per event into ``<state file>.events/``, and the running
agent's health thread takes them, oldest first, on its next poll (within a second), as if NVML had
reported them: an Xid, a GPU that fell off the bus (``gpu-lost``), or its recovery (a reset:
its instances are gone).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, get_args

from kube.atomic_files import write_atomically
from slicer.backend import GpuInfo, HealthEvent, HealthKind
from slicer.devices import MigInstance
from slicer.errors import SlicerError
from slicer.simulated import SimulatedBackend

log = logging.getLogger(__name__)


class StateFileError(SlicerError):
    """The state file cannot be read or describes other GPUs."""


def events_dir(state_path: Path) -> Path:
    """The inbox of health events for the agent that keeps its GPUs in ``state_path``."""
    return state_path.with_name(state_path.name + ".events")


def queue_event(state_path: Path, event: HealthEvent) -> Path:
    """Hand ``event`` to the agent running with ``--simulate-state state_path``; the file
    written (whole, by a rename, so the agent never reads half of it)."""
    if event.kind == "xid" and event.xid is None:
        raise StateFileError("an xid event needs the Xid number")
    inbox = events_dir(state_path)
    inbox.mkdir(parents=True, exist_ok=True)
    record = {"gpu": event.gpu_index, "kind": event.kind, "xid": event.xid}
    path = inbox / f"{time.time_ns():020d}-{os.getpid()}.json"
    write_atomically(path, json.dumps(record).encode(), durable=False)
    return path


def _read_event(path: Path) -> HealthEvent:
    record = json.loads(path.read_text())
    kind = record["kind"]
    if kind not in get_args(HealthKind):
        raise ValueError(f"kind {kind!r} is not one of {', '.join(get_args(HealthKind))}")
    return HealthEvent(int(record["gpu"]), kind, xid=record.get("xid"))


class PersistedBackend:
    """A :class:`SimulatedBackend` saved to ``path`` after every change."""

    def __init__(self, inner: SimulatedBackend, path: Path) -> None:
        self.inner = inner
        self.path = path
        if path.exists():
            try:
                inner.restore(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise StateFileError(
                    f"--simulate-state {path}: cannot take over the saved GPUs: {exc}; "
                    "remove the file to start with idle GPUs"
                ) from exc
        self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(self.inner.snapshot(), indent=1).encode()
        write_atomically(self.path, payload, durable=False)  # a simulation: no power loss

    # --- GpuBackend: reads pass through, changes are saved -------------------------------

    def boot_id(self) -> str:
        return self.inner.boot_id()

    def gpus(self) -> list[GpuInfo]:
        return self.inner.gpus()

    def instances(self, gpu_index: int) -> list[MigInstance]:
        return self.inner.instances(gpu_index)

    def processes(self, gpu_index: int, gi_id: int | None = None) -> list[int]:
        return self.inner.processes(gpu_index, gi_id)

    def capability_minors(self, gpu_index: int, gi_id: int, ci_id: int) -> tuple[int, int]:
        return self.inner.capability_minors(gpu_index, gi_id, ci_id)

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        self._take_queued_events()
        return self.inner.health_events(timeout_s)

    def _take_queued_events(self) -> None:
        """Play the events :func:`queue_event` left in the inbox on the simulated GPUs."""
        inbox = events_dir(self.path)
        try:
            queued = sorted(p for p in inbox.iterdir() if p.suffix == ".json")
        except FileNotFoundError:
            return
        for path in queued:
            try:
                event = _read_event(path)
                if event.kind == "xid":
                    self.inner.inject_xid(event.gpu_index, int(event.xid or 0))
                elif event.kind == "gpu-lost":
                    self.inner.lose_gpu(event.gpu_index)
                else:
                    self.inner.recover_gpu(event.gpu_index)
                log.info("simulated health event", extra={"event": str(event)})
            except (OSError, ValueError, KeyError, TypeError, SlicerError) as exc:
                log.warning(
                    "ignored a queued health event", extra={"file": str(path), "error": str(exc)}
                )
            path.unlink(missing_ok=True)
        if queued:
            self._save()

    def create_gpu_instance(self, gpu_index: int, profile: str, start: int) -> int:
        try:
            return self.inner.create_gpu_instance(gpu_index, profile, start)
        finally:
            self._save()

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> MigInstance:
        try:
            return self.inner.create_compute_instance(gpu_index, gi_id)
        finally:
            self._save()

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        try:
            self.inner.destroy_compute_instance(gpu_index, gi_id, ci_id)
        finally:
            self._save()

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        try:
            self.inner.destroy_gpu_instance(gpu_index, gi_id)
        finally:
            self._save()

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        try:
            self.inner.set_mig_mode(gpu_index, enabled)
        finally:
            self._save()

    def __getattr__(self, name: str) -> Any:
        # Test hooks and anything else of the simulated backend (attach_process, reboot, ...).
        return getattr(self.inner, name)


def read_state(path: Path) -> dict[str, Any]:
    """The saved GPUs, for tests and the sandbox's status."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data
