"""Xid events and lost GPUs through NVML's event set, as the agent's health thread reads them."""

from __future__ import annotations

from gpu_slicer.slicer.backend import HealthEvent
from gpu_slicer.slicer.health import HealthTracker
from gpu_slicer.slicer.nvml import NvmlBackend
from tests.support.nvml_mock import MockNvml


def test_an_xid_reaches_the_agent_with_its_gpu_and_taints_it(
    mock: MockNvml, backend: NvmlBackend
) -> None:
    backend.gpus()
    assert backend.health_events(0.05) == [], "no event: the wait times out quietly"
    mock.xid(1, 48)
    events = backend.health_events(1.0)
    assert events == [HealthEvent(1, "xid", xid=48, message="Xid 48")]
    tracker = HealthTracker(backend)
    mock.xid(1, 48)
    assert tracker.poll(1.0) is True
    assert [t.value for t in tracker.taints(1)] == ["xid-48"] and tracker.taints(0) == ()


def test_an_application_xid_does_not_taint(mock: MockNvml, backend: NvmlBackend) -> None:
    backend.health_events(0)  # the event set exists before the Xid
    mock.xid(0, 13)
    events = backend.health_events(1.0)
    assert events == [HealthEvent(0, "xid", xid=13, message="Xid 13")]
    tracker = HealthTracker(backend)
    assert tracker.apply(events) is False
    assert tracker.unhealthy == {}


def test_xid_79_probes_which_gpu_fell_off_the_bus_and_it_recovers(
    mock: MockNvml, backend: NvmlBackend
) -> None:
    backend.gpus()
    backend.health_events(0)  # the event set exists before the GPU goes
    mock.xid(0, 79)
    mock.lose_gpu(0)
    kinds = [(e.gpu_index, e.kind) for e in backend.health_events(1.0)]
    assert kinds == [(0, "xid"), (0, "gpu-lost")]
    mock.lose_gpu(0, lost=False)
    mock.xid(1, 79)
    kinds = [(e.gpu_index, e.kind) for e in backend.health_events(1.0)]
    assert (0, "recovered") in kinds


def test_a_lost_gpu_keeps_its_facts_and_the_others_stay_usable(
    mock: MockNvml, backend: NvmlBackend
) -> None:
    before = backend.gpus()
    mock.lose_gpu(1)
    after = backend.gpus()
    assert [g.uuid for g in after] == [g.uuid for g in before]
    backend.set_mig_mode(0, True)
    gi = backend.create_gpu_instance(0, "1g.10gb", 3)
    assert backend.create_compute_instance(0, gi).start == 3
