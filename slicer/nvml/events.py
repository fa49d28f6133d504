"""Health events from NVML: Xid critical errors and lost GPUs, best effort.

A GPU that cannot register for events is skipped with a warning; if NVML cannot create an event
set at all, that error is raised (every call) so the caller can fall back to polling.
"""

from __future__ import annotations

import logging
from typing import Any

from gpu_slicer.slicer.backend import HealthEvent
from gpu_slicer.slicer.nvml.session import NvmlSession, address

log = logging.getLogger(__name__)

_XID_FELL_OFF_THE_BUS = 79


class HealthWatch:
    """One NVML event set for every GPU, and which GPUs are known lost."""

    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._event_set: Any = None
        self._lost: set[int] = set()

    def events(self, timeout_s: float) -> list[HealthEvent]:
        """What happened within ``timeout_s`` (the first event waits, the rest are drained)."""
        nvml = self._session.nvml
        event_set = self._events()
        events: list[HealthEvent] = []
        timeout_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = nvml.nvmlEventSetWait(event_set, timeout_ms)
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                    events.extend(self._probe_lost())
                elif exc.value != nvml.NVML_ERROR_TIMEOUT:
                    log.warning("waiting for NVML events failed: %s", exc)
                break
            index = self._index_of(data.device)
            if index is not None and data.eventType & nvml.nvmlEventTypeXidCriticalError:
                xid = int(data.eventData)
                events.append(HealthEvent(index, "xid", xid=xid, message=f"Xid {xid}"))
                if xid == _XID_FELL_OFF_THE_BUS:
                    events.extend(self._probe_lost())
            timeout_ms = 0
        return events

    def free(self) -> None:
        """Free the event set, if one was made (the caller holds the session's lock)."""
        nvml = self._session.nvml
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as exc:
                log.warning("freeing the NVML event set failed: %s", exc)
            self._event_set = None

    def _events(self) -> Any:
        session = self._session
        nvml = session.nvml
        session.start()
        with session.lock:
            if self._event_set is None:
                event_set = session.call(None, "nvmlEventSetCreate")
                for index, handle in enumerate(session.handles):
                    try:
                        nvml.nvmlDeviceRegisterEvents(
                            handle, nvml.nvmlEventTypeXidCriticalError, event_set
                        )
                    except nvml.NVMLError as exc:
                        log.warning("GPU %d reports no Xid events: %s", index, exc)
                self._event_set = event_set
            return self._event_set

    def _index_of(self, device: Any) -> int | None:
        nvml = self._session.nvml
        try:
            return int(nvml.nvmlDeviceGetIndex(device))
        except nvml.NVMLError:
            wanted = address(device)
            for index, handle in enumerate(self._session.handles):
                if address(handle) == wanted:
                    return index
            return None

    def _probe_lost(self) -> list[HealthEvent]:
        """NVML said a GPU is lost without saying which: ask each one."""
        nvml = self._session.nvml
        events: list[HealthEvent] = []
        for index, handle in enumerate(self._session.handles):
            try:
                nvml.nvmlDeviceGetMigMode(handle)
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_GPU_IS_LOST and index not in self._lost:
                    self._lost.add(index)
                    events.append(HealthEvent(index, "gpu-lost", message=str(exc)))
                continue
            if index in self._lost:
                self._lost.discard(index)
                events.append(HealthEvent(index, "recovered", message="GPU answers again"))
        return events
