"""Locks for critical sections that only touch memory, on the admission path.

Under the gevent worker (webhook.worker) ``threading.Lock`` is gevent's lock: an acquire and
release costs about four times the operating system's in a tight loop (some 250 against 60 ns),
more inside a busy worker, and an admission takes several (the translation memo, the template
cache, the namespace cache). A section that only reads or updates in-memory state never yields
to another greenlet while it holds its lock, so no other greenlet can find it taken, and the
operating system's lock is as correct there (tested: it is the OS lock under gevent). With real
threads (the gthread worker, tests, watchers outside gevent) the operating system's lock is
exactly what ``threading.Lock`` would have been.

Never hold one of these across I/O or anything else that can switch greenlets: a greenlet that
then waited for it would block the whole worker.
"""

from __future__ import annotations

import _thread
from typing import Any


def _os_allocate_lock() -> Any:
    try:
        from gevent import monkey
    except ImportError:  # gevent is a dependency; without it nothing is patched
        return _thread.allocate_lock
    return monkey.get_original("_thread", "allocate_lock")


_ALLOCATE = _os_allocate_lock()


def memory_lock() -> _thread.LockType:
    """The operating system's lock, whether or not gevent has patched ``threading``."""
    lock: _thread.LockType = _ALLOCATE()
    return lock
