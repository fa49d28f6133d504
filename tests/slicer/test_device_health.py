"""The health the kubelet's resource-health stream reports: the pure mapping and the live feed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from gpu_slicer.slicer.device_health import (
    DeviceHealth,
    HealthFeed,
    device_health,
    unhealthy_message,
)
from gpu_slicer.slicer.plugin import health_response
from gpu_slicer.slicer.proto import dra_health_v1alpha1_pb2 as pb


def test_every_device_of_an_unhealthy_gpu_is_unhealthy_and_the_others_healthy() -> None:
    devices = ["gpu-1-mig-3g40gb-4", "gpu-0", "gpu-1", "gpu-0-mig-1g10gb-6", "gpu-10"]
    reported = device_health(devices, {1: "xid-79"})
    assert [d.device for d in reported] == sorted(devices)
    by_name = {d.device: d for d in reported}
    assert by_name["gpu-0"] == DeviceHealth("gpu-0", True, "")
    assert by_name["gpu-0-mig-1g10gb-6"].healthy
    assert by_name["gpu-10"].healthy  # gpu-10 is not gpu-1
    for name in ("gpu-1", "gpu-1-mig-3g40gb-4"):
        assert not by_name[name].healthy
        assert by_name[name].message == unhealthy_message(1, "xid-79")
    assert "xid-79" in unhealthy_message(1, "xid-79")


def test_names_that_are_not_ours_are_left_out_and_duplicates_reported_once() -> None:
    assert device_health(["gpu-0", "gpu-0", "nic-3", "gpu-x"], {}) == (DeviceHealth("gpu-0", True),)


def test_the_response_names_the_pool_and_the_timeout_and_keeps_the_message() -> None:
    reported = device_health(["gpu-0", "gpu-1-mig-1g10gb-0"], {1: "gpu-lost"})
    response = health_response("node-a", reported, now=1_700_000_000, timeout_s=30)
    wire = pb.NodeWatchResourcesResponse.FromString(response.SerializeToString())
    assert [
        (d.device.pool_name, d.device.device_name, d.health, d.last_updated_time)
        for d in wire.devices
    ] == [
        ("node-a", "gpu-0", pb.HEALTHY, 1_700_000_000),
        ("node-a", "gpu-1-mig-1g10gb-0", pb.UNHEALTHY, 1_700_000_000),
    ]
    assert {d.health_check_timeout_seconds for d in wire.devices} == {30}
    assert wire.devices[0].message == ""
    assert "gpu-lost" in wire.devices[1].message


class Inputs:
    """What the feed reads: the tracker's unhealthy GPUs and the checkpoint's devices."""

    def __init__(self) -> None:
        self.unhealthy: dict[int, str] = {}
        self.prepared: list[str] = []

    def feed(self) -> HealthFeed:
        return HealthFeed(unhealthy=lambda: dict(self.unhealthy), prepared=lambda: self.prepared)


def _next(stream: Iterator[tuple[DeviceHealth, ...]]) -> tuple[DeviceHealth, ...]:
    """The stream's next list, read on a thread so that a missed wake-up fails instead of
    hanging the run (a deadlock guard, not a timing assertion)."""
    got: list[tuple[DeviceHealth, ...]] = []
    reader = threading.Thread(target=lambda: got.append(next(stream)), daemon=True)
    reader.start()
    reader.join(30)
    assert got, "the stream did not wake up"
    return got[0]


def test_the_feed_reports_published_and_prepared_devices() -> None:
    inputs = Inputs()
    feed = inputs.feed()
    feed.set_published(["gpu-0", "gpu-0-mig-1g10gb-0"])
    inputs.prepared = ["gpu-0-mig-7g80gb-0"]  # prepared, no longer planned: still reported
    assert [d.device for d in feed.current()] == [
        "gpu-0",
        "gpu-0-mig-1g10gb-0",
        "gpu-0-mig-7g80gb-0",
    ]


def test_a_stream_sends_at_once_then_on_each_change_and_not_for_a_wake_up_alone() -> None:
    inputs = Inputs()
    feed = inputs.feed()
    feed.set_published(["gpu-0", "gpu-1"])
    wake = threading.Event()
    stream = feed.stream(wake, lambda: True, resend_s=3600)  # no resend within the test
    assert all(d.healthy for d in _next(stream))
    assert feed.streams == 1

    inputs.unhealthy[1] = "xid-48"
    feed.changed()
    changed = _next(stream)
    assert [(d.device, d.healthy) for d in changed] == [("gpu-0", True), ("gpu-1", False)]

    feed.changed()  # nothing differs: no message; the next one is the real change
    feed.set_published(["gpu-0", "gpu-1", "gpu-2"])
    assert [d.device for d in _next(stream)] == ["gpu-0", "gpu-1", "gpu-2"]
    stream.close()
    assert feed.streams == 0


def test_a_stream_repeats_the_whole_list_when_nothing_changes() -> None:
    inputs = Inputs()
    feed = inputs.feed()
    feed.set_published(["gpu-0"])
    stream = feed.stream(threading.Event(), lambda: True, resend_s=0)
    first = _next(stream)
    assert _next(stream) == first == (DeviceHealth("gpu-0", True),)


def test_a_stream_ends_when_its_caller_goes_away() -> None:
    feed = Inputs().feed()
    alive = threading.Event()
    alive.set()
    wake = threading.Event()
    stream = feed.stream(wake, alive.is_set, resend_s=3600)
    _next(stream)
    ended: list[bool] = []

    def drain() -> None:
        ended.append(list(stream) == [])

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    alive.clear()
    wake.set()  # what the gRPC callback or the server's stop does
    reader.join(30)
    assert ended == [True]
    assert feed.streams == 0


def test_a_watcher_that_does_not_read_holds_one_message_not_a_backlog_of_changes() -> None:
    inputs = Inputs()
    feed = inputs.feed()
    feed.set_published(["gpu-0", "gpu-1"])
    stream = feed.stream(threading.Event(), lambda: True, resend_s=3600)
    _next(stream)
    for i in range(1000):  # faults and recoveries while the watcher reads nothing
        inputs.unhealthy[i % 2] = f"xid-{i}"
        feed.changed()
    latest = _next(stream)
    assert [(d.device, d.message.split("(")[1][:7]) for d in latest] == [
        ("gpu-0", "xid-998"),
        ("gpu-1", "xid-999"),
    ]
    inputs.unhealthy.clear()
    feed.changed()
    assert all(d.healthy for d in _next(stream))  # the next message is the state now, not xid-1
