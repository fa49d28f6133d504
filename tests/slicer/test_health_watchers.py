"""Who may watch the devices' health: the newest gives way, a watcher that stopped reading is
closed, and a send stuck in flow control is cancelled (the registry alone, on a fake clock; the
real gRPC socket is in test_plugin_e2e.py)."""

from __future__ import annotations

import pytest

from gpu_slicer.slicer.health_watchers import HealthWatchers, Watcher


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Cancels:
    """Records which watchers' RPCs the registry cancelled."""

    def __init__(self) -> None:
        self.cancelled: list[int] = []

    def admit(self, watchers: HealthWatchers, name: int) -> Watcher:
        return watchers.admit(lambda: self.cancelled.append(name))


def test_a_newcomer_is_served_and_the_newest_other_watcher_gives_way() -> None:
    clock, rpcs = Clock(), Cancels()
    watchers = HealthWatchers(limit=3, clock=clock)
    kubelet, second, third = (rpcs.admit(watchers, n) for n in range(3))
    for hostile in range(100):
        newcomer = rpcs.admit(watchers, 10 + hostile)
        assert not newcomer.closed
    assert watchers.count == 3
    assert not kubelet.closed and not second.closed
    assert "newest gives way" in third.closed and third.wake.is_set()
    assert watchers.closed == 100
    assert rpcs.cancelled == []  # none was in a send: each ends its stream itself


def test_a_watcher_whose_send_is_pending_for_the_stall_time_is_closed_and_cancelled() -> None:
    clock, rpcs = Clock(), Cancels()
    watchers = HealthWatchers(limit=4, stall_s=30, clock=clock)
    kubelet, reader = rpcs.admit(watchers, 0), rpcs.admit(watchers, 1)
    silent = rpcs.admit(watchers, 2)
    assert watchers.sending(silent)  # flow control holds it: the client reads nothing
    for _ in range(2):
        clock.now += 14
        for watcher in (kubelet, reader):
            assert watchers.sending(watcher)
            watchers.sent(watcher)
    assert not silent.closed  # 28 s: not yet
    clock.now += 2
    watchers.sweep()
    assert "took no message for 30 s" in silent.closed
    assert rpcs.cancelled == [2]  # its thread is stuck in the send: only a cancel frees it
    assert watchers.count == 2
    assert not watchers.sending(silent)


def test_a_watcher_closed_during_a_send_ends_by_itself_or_is_cancelled_after_a_second() -> None:
    clock, rpcs = Clock(), Cancels()
    watchers = HealthWatchers(limit=1, cancel_after_s=1.0, clock=clock)
    quick = rpcs.admit(watchers, 0)
    assert watchers.sending(quick)
    rpcs.admit(watchers, 1)  # quick gives way in the middle of its send
    assert quick.closed
    watchers.sent(quick)  # the send completes: the stream ends with the reason, no cancel
    clock.now += 5
    watchers.sweep()
    assert rpcs.cancelled == []

    slow = watchers.admit(lambda: rpcs.cancelled.append(2))
    assert watchers.sending(slow)
    rpcs.admit(watchers, 3)
    clock.now += 0.5
    watchers.sweep()
    assert rpcs.cancelled == []
    clock.now += 0.5
    watchers.sweep()
    assert rpcs.cancelled == [2]
    watchers.sweep()
    assert rpcs.cancelled == [2]  # once


def test_a_stream_that_ends_frees_its_place() -> None:
    watchers = HealthWatchers(limit=2, clock=Clock())
    first = watchers.admit(lambda: None)
    second = watchers.admit(lambda: None)
    watchers.leave(first)
    third = watchers.admit(lambda: None)
    assert not second.closed and not third.closed
    assert watchers.count == 2


def test_at_least_one_watcher_is_allowed() -> None:
    with pytest.raises(ValueError, match="at least one"):
        HealthWatchers(limit=0)
