"""Health: lost GPUs and critical Xids taint that GPU's devices until it recovers."""

from __future__ import annotations

import threading

from gpu_slicer.core.devices import DeviceTaint
from gpu_slicer.slicer.backend import HealthEvent
from gpu_slicer.slicer.errors import BackendError
from gpu_slicer.slicer.health import HealthTracker, is_critical
from gpu_slicer.slicer.simulated import SimulatedBackend


def tracker() -> tuple[SimulatedBackend, HealthTracker, list[int]]:
    backend = SimulatedBackend("H100-80GB:2")
    changes: list[int] = []
    return backend, HealthTracker(backend, on_change=lambda: changes.append(1)), changes


def test_a_lost_gpu_taints_only_its_own_devices_until_it_recovers() -> None:
    backend, health, changes = tracker()
    backend.lose_gpu(1)
    assert health.poll(0)
    assert health.taints(1) == (DeviceTaint("gpu-slicer.io/unhealthy", "gpu-lost", "NoSchedule"),)
    assert health.taints(0) == ()
    backend.recover_gpu(1)
    assert health.poll(0)
    assert health.taints(1) == () and len(changes) == 2


def test_a_critical_xid_taints_and_an_application_xid_does_not() -> None:
    backend, health, changes = tracker()
    backend.inject_xid(0, 13)  # an application's illegal memory access
    assert not health.poll(0)
    backend.inject_xid(0, 79)  # fallen off the bus
    assert health.poll(0)
    assert health.unhealthy == {0: "xid-79"}
    assert changes == [1]


def test_a_repeated_event_is_not_a_change() -> None:
    _, health, changes = tracker()
    event = HealthEvent(0, "xid", xid=48)
    assert health.apply([event]) and not health.apply([event])
    assert changes == [1]


def test_criticality_of_event_kinds() -> None:
    assert is_critical(HealthEvent(0, "gpu-lost"))
    assert is_critical(HealthEvent(0, "xid", xid=94))
    assert not is_critical(HealthEvent(0, "xid", xid=31))
    assert not is_critical(HealthEvent(0, "recovered"))


class _StopOnWait(threading.Event):
    """A stop event that records each wait and ends the loop on the first one."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.set()
        return True


def test_the_health_thread_waits_between_polls_when_events_are_unavailable() -> None:
    stop = _StopOnWait()
    calls: list[float] = []

    class NoEvents(SimulatedBackend):
        def health_events(self, timeout_s: float) -> list[HealthEvent]:
            calls.append(timeout_s)
            if len(calls) >= 5:
                stop.set()  # the loop spins without ever waiting: end the test anyway
            raise BackendError("NVML cannot create an event set on this GPU")

    HealthTracker(NoEvents("H100-80GB:1")).run(stop, poll_s=0.5)
    assert len(calls) == 1
    assert stop.waits == [0.5]
