"""Each device's health as the kubelet's resource-health service reports it (KEP-4680).

A kubelet of 1.36 or newer (feature ``ResourceHealthStatus``) opens ``NodeWatchResources`` on the
plugin's socket, keeps the stream open and writes what it hears into the status of the pods whose
claims hold the devices (``allocatedResourcesStatus``). Two rules of the kubelet shape this module:
a message must list every device of the driver, and the kubelet stamps each device with the time
it *received* the report and shows it as Unknown once ``health_check_timeout_seconds`` pass
without another. So the stream sends the whole list when anything changes and again every
``RESEND_S`` when nothing does.

What is unhealthy is what :mod:`slicer.health` already decides for the ResourceSlices' taints: a
GPU that fell off the bus or had a critical Xid makes every device on it unhealthy, the whole-GPU
device and each MIG slice, prepared or not, until the GPU recovers. The ``rollback-failed`` taint
of :mod:`slicer.state` is left out on purpose: it keeps the scheduler away from a GPU whose
leftover instance may still be occupied, while the hardware, and the pods running on it, are fine.

:func:`device_health` is the pure mapping; :class:`HealthFeed` holds the live inputs and wakes the
open streams when they change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from gpu_slicer.core.devices import parse_device_name
from gpu_slicer.core.errors import DeviceNameError
from gpu_slicer.core.identity import UNHEALTHY_TAINT

RESEND_S = 10.0
"""The whole list again after this long without a change (well inside ``TIMEOUT_S``)."""
TIMEOUT_S = 30
"""``health_check_timeout_seconds``: a device the kubelet hears nothing of for this long is
Unknown (the kubelet's own default, said explicitly so that it cannot drift)."""


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health; ``message`` says why when it is not healthy."""

    device: str
    healthy: bool
    message: str = ""


def unhealthy_message(gpu_index: int, reason: str) -> str:
    """Stable for as long as the reason is (the kubelet counts a new message as a change)."""
    return (
        f"GPU {gpu_index} is unhealthy ({reason}); gpu-slicer taints its devices "
        f"{UNHEALTHY_TAINT}=NoSchedule until the GPU recovers"
    )


def device_health(devices: Iterable[str], unhealthy: Mapping[int, str]) -> tuple[DeviceHealth, ...]:
    """The health of each device, sorted by name. ``unhealthy`` is GPU index -> reason, as
    :attr:`slicer.health.HealthTracker.unhealthy` gives it; names that are not gpu-slicer's
    devices are left out (the kubelet never prepared them from this driver)."""
    found: list[DeviceHealth] = []
    for name in sorted(set(devices)):
        try:
            gpu = parse_device_name(name).gpu_index
        except DeviceNameError:
            continue
        reason = unhealthy.get(gpu)
        if reason is None:
            found.append(DeviceHealth(name, True))
        else:
            found.append(DeviceHealth(name, False, unhealthy_message(gpu, reason)))
    return tuple(found)


class HealthFeed:
    """The devices' health now, and a wake-up for every open stream when it may have changed.

    The device list is what the publisher last planned for the pool (:meth:`set_published`)
    plus every device the checkpoint holds prepared, so that a running pod's device is reported
    even while the apiserver, and with it publishing, is unreachable.
    """

    def __init__(
        self,
        *,
        unhealthy: Callable[[], Mapping[int, str]],
        prepared: Callable[[], Iterable[str]] = lambda: (),
    ) -> None:
        self._unhealthy = unhealthy
        self._prepared = prepared
        self._lock = threading.Lock()
        self._published: frozenset[str] = frozenset()
        self._waiters: set[threading.Event] = set()

    def set_published(self, devices: Iterable[str]) -> None:
        names = frozenset(devices)
        with self._lock:
            if names == self._published:
                return
            self._published = names
        self.changed()

    def current(self) -> tuple[DeviceHealth, ...]:
        with self._lock:
            published = self._published
        return device_health(published | set(self._prepared()), self._unhealthy())

    def changed(self) -> None:
        """Wake every stream; each sends only if its list really differs."""
        with self._lock:
            waiters = list(self._waiters)
        for event in waiters:
            event.set()

    def stream(
        self,
        wake: threading.Event,
        alive: Callable[[], bool],
        *,
        resend_s: float = RESEND_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> Iterator[tuple[DeviceHealth, ...]]:
        """The list now, then again on each change and after ``resend_s`` without one, until
        ``alive()`` turns false. ``wake`` is set to make it look again (a change, or the caller
        going away)."""
        with self._lock:
            self._waiters.add(wake)
        try:
            while alive():
                sent = self.current()
                yield sent
                due = clock() + resend_s
                while alive():
                    wake.wait(max(0.0, due - clock()))
                    wake.clear()
                    if clock() >= due or self.current() != sent:
                        break
        finally:
            with self._lock:
                self._waiters.discard(wake)

    @property
    def streams(self) -> int:
        """How many streams are open (for tests and the metrics)."""
        with self._lock:
            return len(self._waiters)


__all__ = [
    "RESEND_S",
    "TIMEOUT_S",
    "DeviceHealth",
    "HealthFeed",
    "device_health",
    "unhealthy_message",
]
