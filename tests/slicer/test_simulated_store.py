"""Simulated GPUs kept in a file: health events queued from outside reach the agent's backend."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gpu_slicer.slicer.backend import HealthEvent
from gpu_slicer.slicer.errors import GpuLost
from gpu_slicer.slicer.simulated import SimulatedBackend
from gpu_slicer.slicer.simulated_store import (
    PersistedBackend,
    StateFileError,
    events_dir,
    queue_event,
)


@pytest.fixture
def store(tmp_path: Path) -> PersistedBackend:
    return PersistedBackend(SimulatedBackend("H100-80GB:2"), tmp_path / "gpus.json")


def test_queued_events_are_played_in_order_on_the_next_poll(store: PersistedBackend) -> None:
    queue_event(store.path, HealthEvent(1, "xid", xid=79))
    queue_event(store.path, HealthEvent(0, "gpu-lost"))
    events = store.health_events(0)
    assert [(e.gpu_index, e.kind, e.xid) for e in events] == [(1, "xid", 79), (0, "gpu-lost", None)]
    assert list(events_dir(store.path).iterdir()) == []
    assert store.health_events(0) == []  # taken once
    with pytest.raises(GpuLost):
        store.instances(0)


def test_a_recovery_resets_the_gpu(store: PersistedBackend) -> None:
    store.set_mig_mode(0, True)
    gi = store.create_gpu_instance(0, "1g.10gb", 0)
    store.create_compute_instance(0, gi)
    queue_event(store.path, HealthEvent(0, "recovered"))
    assert [e.kind for e in store.health_events(0)] == ["recovered"]
    assert store.instances(0) == []


def test_an_unreadable_event_is_dropped_and_the_rest_still_played(store: PersistedBackend) -> None:
    inbox = events_dir(store.path)
    inbox.mkdir()
    (inbox / "0-bad.json").write_text('{"gpu": 0, "kind": "melted"}')
    (inbox / "1-worse.json").write_text("not json")
    queue_event(store.path, HealthEvent(1, "xid", xid=48))
    assert [(e.gpu_index, e.xid) for e in store.health_events(0)] == [(1, 48)]
    assert list(inbox.iterdir()) == []


def test_hostile_inbox_entries_get_one_warning_each_and_later_events_are_still_played(
    store: PersistedBackend, caplog: pytest.LogCaptureFixture
) -> None:
    inbox = events_dir(store.path)
    inbox.mkdir()
    (inbox / "0-deep.json").write_text("[" * 2000 + "]" * 2000)  # within the size limit
    (inbox / "1-folder.json").mkdir()
    (inbox / "1-folder.json" / "inside.json").write_text("{}")
    (inbox / "2-invalid.json").write_text('{"gpu": 0, "kind": ')
    (inbox / "3-list.json").write_text("[1, 2]")
    (inbox / "4-huge.json").write_text(" " * 100_000 + "{}")
    (inbox / "5-link.json").symlink_to(store.path)
    os.mkfifo(inbox / "6-pipe.json")
    queue_event(store.path, HealthEvent(1, "xid", xid=48))

    caplog.set_level(logging.WARNING, logger="gpu_slicer.slicer.simulated_store")
    assert [(e.gpu_index, e.xid) for e in store.health_events(0)] == [(1, 48)]
    for _ in range(3):  # the next polls: nothing new, no warning again
        assert store.health_events(0) == []
    queue_event(store.path, HealthEvent(0, "gpu-lost"))
    assert [e.kind for e in store.health_events(0)] == ["gpu-lost"]

    warned = [r.file for r in caplog.records if r.levelno == logging.WARNING]  # type: ignore[attr-defined]
    assert sorted(Path(f).name for f in warned) == [
        "0-deep.json",
        "1-folder.json",
        "2-invalid.json",
        "3-list.json",
        "4-huge.json",
        "5-link.json",
        "6-pipe.json",
    ]
    assert [p.name for p in inbox.iterdir()] == ["1-folder.json"]  # a folder is left alone
    assert store.path.is_file()  # the link's target was not touched
    deep = next(r for r in caplog.records if "0-deep" in r.file)  # type: ignore[attr-defined]
    # RecursionError under the interpreter's default limit; a raised limit parses it as a list
    assert deep.error in ("JSON nested too deeply", "not a JSON object")  # type: ignore[attr-defined]


def test_an_xid_event_needs_its_number(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match="Xid number"):
        queue_event(tmp_path / "gpus.json", HealthEvent(0, "xid"))
