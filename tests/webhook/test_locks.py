"""The admission path's memory-only locks: the operating system's, even under gevent."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpu_slicer.webhook.locks import memory_lock

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("imported", ["after", "before"])
def test_after_gevent_patches_threading_the_lock_is_still_the_operating_systems(
    imported: str,
) -> None:
    # A fresh interpreter: patching this one would change every other test. The module may
    # be imported before gevent patches (the lock is chosen when it is made) or after.
    patch = "from gevent import monkey; monkey.patch_all()\n"
    script = (
        ("" if imported == "after" else "from webhook.locks import memory_lock\n")
        + patch
        + "import threading, _thread\n"
        "from gevent.monkey import get_original\n"
        "from webhook.locks import memory_lock\n"
        "os_lock = type(get_original('_thread', 'allocate_lock')())\n"
        "print(type(memory_lock()) is os_lock, type(threading.Lock()) is os_lock)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    # memory_lock keeps the OS lock where threading.Lock became gevent's.
    assert done.stdout.split() == ["True", "False"]


def test_the_lock_excludes_real_threads() -> None:
    lock = memory_lock()
    assert lock.acquire(blocking=False)
    taken: list[bool] = []
    other = threading.Thread(target=lambda: taken.append(lock.acquire(blocking=False)))
    other.start()
    other.join()
    assert taken == [False]
    lock.release()
