"""GPU health: backend events become (and stop being) taints on that GPU's devices.

A lost GPU or a critical Xid marks the GPU unhealthy: every device the agent advertises for it
gets the taint ``gpu-slicer.io/unhealthy`` with effect ``NoSchedule`` (value: why), so the
scheduler stops placing new claims there while running pods are left alone. A ``recovered``
event clears it. Each change calls ``on_change`` so the agent republishes its ResourceSlices.

Which Xids are critical follows NVIDIA's device plugin: Xids that only mean "an application
faulted" (13, 31, 43, 45, 68, 109) leave the GPU usable; every other Xid taints it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from gpu_slicer.core.devices import DeviceTaint
from gpu_slicer.core.identity import UNHEALTHY_TAINT
from gpu_slicer.slicer.agent_metrics import AgentMetrics
from gpu_slicer.slicer.backend import GpuBackend, HealthEvent
from gpu_slicer.slicer.errors import BackendError

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

log = logging.getLogger(__name__)


def is_critical(event: HealthEvent, ignored_xids: frozenset[int] = APPLICATION_XIDS) -> bool:
    if event.kind == "gpu-lost":
        return True
    if event.kind == "xid":
        return event.xid is None or event.xid not in ignored_xids
    return False


def reason_for(event: HealthEvent) -> str:
    """The taint value: a label-safe word for why the GPU is unhealthy."""
    return "gpu-lost" if event.kind == "gpu-lost" else f"xid-{event.xid}"


class HealthTracker:
    """Which GPUs are unhealthy, fed by backend health events."""

    def __init__(
        self,
        backend: GpuBackend,
        *,
        on_change: Callable[[], None] | None = None,
        metrics: AgentMetrics | None = None,
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
    ) -> None:
        self._backend = backend
        self._on_change = on_change
        self._metrics = metrics
        self._ignored = ignored_xids
        self._lock = threading.Lock()
        self._unhealthy: dict[int, str] = {}

    @property
    def unhealthy(self) -> dict[int, str]:
        """GPU index -> reason, for every GPU that is tainted now."""
        with self._lock:
            return dict(self._unhealthy)

    def taints(self, gpu_index: int) -> tuple[DeviceTaint, ...]:
        with self._lock:
            reason = self._unhealthy.get(gpu_index)
        if reason is None:
            return ()
        return (DeviceTaint(UNHEALTHY_TAINT, reason, "NoSchedule"),)

    def apply(self, events: Iterable[HealthEvent]) -> bool:
        """Take events into account; True when the set of unhealthy GPUs or reasons changed."""
        changed = False
        with self._lock:
            for event in events:
                if event.kind == "recovered":
                    if self._unhealthy.pop(event.gpu_index, None) is not None:
                        changed = True
                        log.info("GPU recovered", extra={"gpu": event.gpu_index})
                elif is_critical(event, self._ignored):
                    reason = reason_for(event)
                    if self._unhealthy.get(event.gpu_index) != reason:
                        self._unhealthy[event.gpu_index] = reason
                        changed = True
                        log.warning(
                            "GPU unhealthy",
                            extra={
                                "gpu": event.gpu_index,
                                "reason": reason,
                                "detail": event.message,
                            },
                        )
                else:
                    log.info("non-critical Xid", extra={"gpu": event.gpu_index, "xid": event.xid})
            count = len(self._unhealthy)
        if self._metrics is not None:
            self._metrics.unhealthy_gpus.set(count)
        if changed and self._on_change is not None:
            try:
                self._on_change()
            except Exception:
                log.exception("health change callback failed")
        return changed

    def poll(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for events and apply them."""
        events = self._events(timeout_s)
        return self.apply(events) if events is not None else False

    def _events(self, timeout_s: float) -> list[HealthEvent] | None:
        """The backend's events; None when it cannot deliver any (logged)."""
        try:
            return self._backend.health_events(timeout_s)
        except BackendError as exc:
            log.warning("health events unavailable", extra={"error": str(exc)})
            return None

    def run(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Poll until ``stop`` is set (the agent's health thread)."""
        while not stop.is_set():
            try:
                events = self._events(poll_s)
                if events is None:
                    # The backend answers at once when it has no event source (NVML without an
                    # event set): wait, or this thread spins and floods the log.
                    stop.wait(poll_s)
                    continue
                self.apply(events)
            except Exception:
                log.exception("health poll failed")
                stop.wait(poll_s)
