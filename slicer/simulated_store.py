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
its instances are gone). An entry that is not such an event (not a regular file, larger than
:data:`MAX_EVENT_BYTES`, not JSON, nested too deeply, an unknown kind) is skipped with one
warning and removed when it is a file; a folder or anything else that cannot be removed is
remembered and not looked at again. Later events are played all the same.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any, get_args

from gpu_slicer.core.devices import MigInstance
from gpu_slicer.kube.atomic_files import ensure_dir, write_atomically
from gpu_slicer.slicer.backend import GpuInfo, HealthEvent, HealthKind
from gpu_slicer.slicer.errors import SlicerError
from gpu_slicer.slicer.simulated import SimulatedBackend

log = logging.getLogger(__name__)


MAX_EVENT_BYTES = 4096
"""An event file is a small JSON object; anything larger is not one."""


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
    ensure_dir(inbox, 0o750)
    record = {"gpu": event.gpu_index, "kind": event.kind, "xid": event.xid}
    path = inbox / f"{time.time_ns():020d}-{os.getpid()}.json"
    write_atomically(path, json.dumps(record).encode(), durable=False)
    return path


def _read_event(path: Path) -> HealthEvent:
    """The event in ``path``; ValueError (or OSError) says why it is not one. Opened without
    following a link and without waiting on a pipe; only a regular file is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        raw = os.read(fd, MAX_EVENT_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_EVENT_BYTES:
        raise ValueError(f"larger than {MAX_EVENT_BYTES} bytes")
    try:
        record = json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    kind = record["kind"]
    if kind not in get_args(HealthKind):
        raise ValueError(f"kind {kind!r} is not one of {', '.join(get_args(HealthKind))}")
    return HealthEvent(int(record["gpu"]), kind, xid=record.get("xid"))


class PersistedBackend:
    """A :class:`SimulatedBackend` saved to ``path`` after every change."""

    def __init__(self, inner: SimulatedBackend, path: Path) -> None:
        self.inner = inner
        self.path = path
        self._skipped: set[str] = set()
        """Inbox entries warned about once that could not be removed (a folder)."""
        self._inbox_problem = ""
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
        ensure_dir(self.path.parent, 0o750)
        payload = json.dumps(self.inner.snapshot(), indent=1).encode()
        write_atomically(self.path, payload, durable=False)  # a simulation: no power loss

    def reboot(self) -> None:
        """The node rebooted while no agent ran: the GPUs are empty, the boot id new (saved)."""
        self.inner.reboot()
        self._save()

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
        """Play the events :func:`queue_event` left in the inbox on the simulated GPUs; skip,
        with one warning each, the entries that are not events."""
        inbox = events_dir(self.path)
        try:
            names = sorted(p.name for p in inbox.iterdir() if p.suffix == ".json")
        except FileNotFoundError:
            return
        except OSError as exc:
            if str(exc) != self._inbox_problem:
                self._inbox_problem = str(exc)
                log.warning("cannot read the health event inbox", extra={"error": str(exc)})
            return
        self._inbox_problem = ""
        self._skipped &= set(names)  # forget what is gone; the set never outgrows the folder
        played = False
        for name in names:
            if name in self._skipped:
                continue
            path = inbox / name
            try:
                event = _read_event(path)
                if event.kind == "xid":
                    self.inner.inject_xid(event.gpu_index, int(event.xid or 0))
                elif event.kind == "gpu-lost":
                    self.inner.lose_gpu(event.gpu_index)
                else:
                    self.inner.recover_gpu(event.gpu_index)
                played = True
                log.info("simulated health event", extra={"event": str(event)})
            except Exception as exc:  # any entry whatever: skipped, the inbox goes on
                log.warning(
                    "ignored an entry of the health event inbox that is not an event",
                    extra={"file": str(path), "error": str(exc) or type(exc).__name__},
                )
            try:
                path.unlink(missing_ok=True)
            except OSError:
                self._skipped.add(name)  # a folder: left alone, and not warned about again
        if played:
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
